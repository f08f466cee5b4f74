"""benchmarks/rules_eval.py's parts, one concern a module, so that each can be read and tested on
its own. Named apart from the script: a module and a package of one name in one directory
collide on import."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))  # the repository, for fleet/
