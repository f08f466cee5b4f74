#!/usr/bin/env python3
"""Derive exporter/xid/sxid_catalog.csv from NVIDIA's NVSwitch SXid tables, as NVIDIA publishes them.

Source: NVIDIA, "Fabric Manager for NVIDIA NVSwitch Systems" user guide,
https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html (also as
https://docs.nvidia.com/datacenter/tesla/pdf/fabric-manager-user-guide.pdf), the appendix
on NVSwitch SXid errors: its "Non-Fatal", "Fatal", "Always Fatal" and "Other Notable"
NVSwitch SXid error tables. Only facts are kept: the code, its name, and the table it is in.

Input: the appendix as text, one table heading per line ("Non-Fatal NVSwitch SXid Errors",
...) followed by that table's rows, one per line: the SXid, then its name, separated by a tab
or by " (" ... ")" as the guide's rows print them ("11004 (Ingress invalid ACL)"). Other lines
are ignored.

Output: our CSV (sxid,name,table,severity), one row per code, sorted, under '#' lines naming
the source. severity: fatal for the Fatal and Always Fatal tables, nonfatal for Non-Fatal,
empty for Other Notable (the guide gives those no class: the collector then says unknown,
unless the log line itself says Fatal or Non-fatal).

    python scripts/sxid_catalog.py SAVED_FILE --retrieved YYYY-MM-DD --version "DU-09883-001_v1.3" \\
        --out exporter/xid/sxid_catalog.csv

Pure standard library.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections.abc import Sequence
from pathlib import Path

SOURCE_URL = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html"
FIELDS = ("sxid", "name", "table", "severity")
TABLES = {"non-fatal": ("non_fatal", "nonfatal"), "fatal": ("fatal", "fatal"),
          "always fatal": ("always_fatal", "fatal"), "other notable": ("other_notable", "")}
HEADING = re.compile(r"^\s*(?:Table \S+\s+)?(Non-Fatal|Fatal|Always Fatal|Other Notable) NVSwitch SXid Errors?\s*$",
                     re.IGNORECASE)
ROW = re.compile(r"^\s*([0-9]{4,6})(?:\t+|\s+\()\s*([^\t)]*[^\t)\s])\)?\s*$")


def parse(text: str) -> list[dict[str, str]]:
    table: tuple[str, str] | None = None
    rows: dict[int, dict[str, str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        heading = HEADING.match(line)
        if heading:
            table = TABLES[heading[1].lower()]
            continue
        row = ROW.match(line)
        if row is None or table is None:
            continue
        code = int(row[1])
        if code in rows:
            raise ValueError(f"line {number}: SXid {code} appears twice")
        rows[code] = {"sxid": str(code), "name": " ".join(row[2].split()), "table": table[0], "severity": table[1]}
    if not rows:
        raise ValueError("no SXid rows under an NVSwitch SXid Errors heading")
    return [rows[code] for code in sorted(rows)]


def render(rows: list[dict[str, str]], *, retrieved: str, version: str | None) -> str:
    out = io.StringIO()
    out.write("# NVIDIA's NVSwitch SXid errors: the table each SXid is listed in, and its severity class.\n")
    out.write(f"# source: {SOURCE_URL} (NVIDIA, Fabric Manager for NVIDIA NVSwitch Systems, "
              "appendix: NVSwitch SXid errors)\n")
    out.write(f"# guide version: {version or 'none shown in the copy used'}; retrieved {retrieved}\n")
    out.write("# derived by: scripts/sxid_catalog.py (see docs/sxid-catalog.md); regenerate, do not edit by hand\n")
    out.write("# severity is empty for the Other Notable table: the guide gives those SXids no class\n")
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("input", type=Path, help="the guide's SXid tables as text")
    parser.add_argument("--retrieved", required=True, metavar="YYYY-MM-DD", help="when the input was saved")
    parser.add_argument("--version", help="the guide's document version, if the input shows one")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    try:
        output = render(parse(args.input.read_text(encoding="utf-8-sig")), retrieved=args.retrieved,
                        version=args.version)
    except ValueError as err:
        print(f"{args.input}: {err}", file=sys.stderr)
        return 1
    if args.out:
        args.out.write_text(output, encoding="utf-8")
    else:
        sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
