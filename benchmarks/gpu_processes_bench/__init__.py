"""benchmarks/gpu_processes.py's parts: the process fleet, ours in-process, both exporters over
HTTP, the report and the command line, one module each, so that a measurement can be read
without the others. Named apart from the script: a module and a package of one name in one
directory collide on import."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
