"""benchmarks/xid.py's parts: the records written, the exporters under test, each of the three
measurements, the report and the command line, one module each, so that a measurement can be
read without the others. Named apart from the script: a module and a package of one name in one
directory collide on import."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
