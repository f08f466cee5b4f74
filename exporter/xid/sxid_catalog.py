"""NVIDIA's NVSwitch SXid tables: the severity class of each SXid code.

sxid_catalog.csv is derived from the Fabric Manager user guide's appendix by
scripts/sxid_catalog.py and never edited by hand (docs/sxid-catalog.md); this module only
reads and checks it. The severity a log line states wins; the catalog answers for lines
that state none, and UNKNOWN for a code it lacks or gives no class.
"""

from __future__ import annotations

import csv
import functools
from importlib import resources

UNKNOWN = "unknown"
HEADER = ("sxid", "name", "table", "severity")
TABLES = ("non_fatal", "fatal", "always_fatal", "other_notable")
SEVERITIES = ("fatal", "nonfatal", "")


def parse(text: str) -> dict[int, tuple[str, str, str]]:
    """sxid -> (name, table, severity). ValueError naming the line for anything malformed."""
    rows: dict[int, tuple[str, str, str]] = {}
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip() and line[0] != "#"]
    if not lines or tuple(next(csv.reader([lines[0][1]]))) != HEADER:
        raise ValueError(f"expected the header {','.join(HEADER)!r}")
    for number, line in lines[1:]:
        row = next(csv.reader([line]))
        if len(row) != len(HEADER) or not row[0].isdigit() or row[2] not in TABLES or row[3] not in SEVERITIES:
            raise ValueError(f"line {number}: malformed row {line!r}")
        if int(row[0]) in rows:
            raise ValueError(f"line {number}: duplicate SXid {row[0]}")
        rows[int(row[0])] = (row[1], row[2], row[3])
    return rows


@functools.cache
def load() -> dict[int, tuple[str, str, str]]:
    return parse(resources.files(__package__).joinpath("sxid_catalog.csv").read_text(encoding="utf-8"))


def severity(code: int, stated: str | None) -> str:
    """What the line stated, else the catalog's class, else UNKNOWN."""
    if stated:
        return stated
    entry = load().get(code)
    return entry[2] if entry is not None and entry[2] else UNKNOWN
