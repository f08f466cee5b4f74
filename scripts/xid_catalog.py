#!/usr/bin/env python3
"""Derive exporter/xid/catalog.csv from NVIDIA's Xid catalog, as NVIDIA publishes it.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html -- its "Xids" table,
also offered there as a spreadsheet. Only facts are kept: code, mnemonic, description, the
two resolution buckets, the Xid 154 linkage and the four "Applies to" flags; the Trigger
Conditions text is dropped.

Input, detected by shape:
  * the spreadsheet's "Xids" sheet saved as CSV: columns found by their header names;
  * the page's table as text in the pipe form that text renderings of the page have (and the
    stored copy used for the committed file has): the header cells, a |---|---| line, then
    one cell per line ending in " |", and each row's empty cells collapsed into one line of
    pipes at the row's end ("||" = two empty cells). Because empty cells lose their place,
    a row's cells after the four "Applies to" flags are put back in column order by what
    they look like: immediate bucket (an upper-case token), investigatory bucket (a token,
    a "Solo: ... Not Solo: ..." phrase, or "N/A..."), 154 linkage ("CUDA 12.x; GPU driver
    Rnnn", "yes; ...", "N/A; Unused"), trigger text (anything else).

Output: our CSV (code,mnemonic,description,immediate_action,investigatory_action,
xid154_linkage,a100,h100,b100,gb200), one row per code, sorted, under '#' lines naming the
source. immediate_action keeps only the leading upper-case token of NVIDIA's cell; it is
empty where NVIDIA gives no bucket (Catalog.action() then answers UNKNOWN).

Regenerating when NVIDIA updates the catalog:
  1. Save NVIDIA's table outside the repository (NVIDIA's material is not ours to commit):
     either download the spreadsheet linked from the page and save its "Xids" sheet as CSV,
     or save the page's table as text in the pipe form described above.
  2. python scripts/xid_catalog.py SAVED_FILE --retrieved YYYY-MM-DD [--version V] \\
         --out exporter/xid/catalog.csv
     (--version: the catalog's version or date if the saved copy shows one.)
  3. Review `git diff exporter/xid/catalog.csv`. If NVIDIA added a bucket, add it to
     BUCKETS in tests/test_xid_catalog.py and to docs/xid-catalog.md; re-check the spot
     checks there; run `make test`.
The committed file came from a stored copy of the page's table (pipe form), with
  python scripts/xid_catalog.py page.txt --retrieved 2026-11-22 --out exporter/xid/catalog.csv

Pure standard library.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

SOURCE_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
FIELDS = ("code", "mnemonic", "description", "immediate_action", "investigatory_action",
          "xid154_linkage", "a100", "h100", "b100", "gb200")
PRODUCTS = ("a100", "h100", "b100", "gb200")

# NVIDIA's column headers, normalised (lower case, single spaces), in the page's order.
COLUMNS = ("type (xid)", "code", "mnemonic", "description",
           "applies to a100", "applies to h100", "applies to b100", "applies to gb200",
           "resolution bucket (immediate action)", "resolution bucket (investigatory action)",
           "xid 154 linkage", "trigger conditions")
FIXED = 8  # type, code, mnemonic, description, four flags: never empty in NVIDIA's table

SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")
TOKEN = re.compile(r"^([A-Z][A-Z0-9_]*[A-Z0-9])(?=$|[\s(;:,])")
IDENTIFIER = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")
LINKAGE = re.compile(r"^(CUDA \d|(?i:yes|no);|N/A(;|$))")
FLAGS = {"YES": "1", "NO": "0"}


def _norm(text: str) -> str:
    return " ".join(text.split())


def immediate_token(cell: str) -> str | None:
    """The bucket at the head of an Immediate Action cell ("RESET_GPU", "XID_154"), or None."""
    m = TOKEN.match(cell)
    return m.group(1) if m and not LINKAGE.match(cell) else None


def _fits(slot: str, cell: str) -> bool:
    if slot == "immediate":
        return immediate_token(cell) is not None
    if slot == "investigatory":
        return not re.match(r"^(CUDA \d|(?i:yes|no);)", cell) and (
            cell.startswith("N/A") or bool(IDENTIFIER.search(cell)) or bool(TOKEN.match(cell)))
    if slot == "linkage":
        return bool(LINKAGE.match(cell))
    return True  # trigger conditions: anything


def _flag(value: str, where: str) -> str:
    try:
        return FLAGS[value.strip().upper()]
    except KeyError:
        raise ValueError(f"{where}: applies-to flag {value!r} is neither YES nor NO") from None


def _record(code: str, mnemonic: str, description: str, immediate: str, investigatory: str,
            linkage: str, flags: Sequence[str], where: str) -> dict[str, str]:
    try:
        number = int(code)
    except ValueError:
        raise ValueError(f"{where}: code {code!r} is not an integer") from None
    token = immediate_token(immediate) if immediate else ""
    if token is None:
        print(f"{where}: Xid {number}: immediate action {immediate!r} holds no bucket; left empty",
              file=sys.stderr)
        token = ""
    row = {"code": str(number), "mnemonic": _norm(mnemonic), "description": _norm(description),
           "immediate_action": token, "investigatory_action": _norm(investigatory),
           "xid154_linkage": _norm(linkage)}
    for product, value in zip(PRODUCTS, flags, strict=True):
        row[product] = _flag(value, f"{where}: Xid {number}")
    return row


# --- the page's table as pipe text ---------------------------------------------------------

def _pipe_cells(lines: Iterable[str]) -> list[str]:
    """One string per cell; '' for each empty cell; stops at the first blank line."""
    cells: list[str] = []
    pending = ""
    for line in lines:
        text = line.strip()
        if not text:
            break
        if set(text) == {"|"}:
            cells.extend([""] * len(text))
        elif text.endswith("|"):
            cells.append(_norm(pending + " " + text[:-1]))
            pending = ""
        else:  # a cell's text runs on to the next line
            pending += " " + text
    if pending.strip():
        cells.append(_norm(pending))
    return cells


def parse_pipe(text: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    for sep, line in enumerate(lines):
        if not SEPARATOR.match(line):
            continue
        start = sep
        while start > 0 and lines[start - 1].strip():
            start -= 1
        header = tuple(_norm(c).lower() for c in _pipe_cells(lines[start:sep]))
        if "code" in header and "mnemonic" in header:
            break
    else:
        raise ValueError("no table with Code and Mnemonic columns found")
    if header != COLUMNS:
        raise ValueError(f"the table's columns are {header}, expected {COLUMNS}: NVIDIA changed the "
                         "table, teach scripts/xid_catalog.py the new layout")
    cells = _pipe_cells(lines[sep + 1:])
    starts = [i for i in range(len(cells) - 1) if cells[i] == "XID" and cells[i + 1].isdigit()]
    if not starts or starts[0] != 0:
        raise ValueError(f"the table body does not start with an XID row: {cells[:3]}")
    records = []
    for n, begin in enumerate(starts):
        last = n == len(starts) - 1
        row = cells[begin:starts[n + 1] if not last else len(cells)]
        where = f"Xid {row[1]}"
        # The renderer drops the empty cells of the table's last row altogether.
        if len(row) > len(COLUMNS) or (len(row) < len(COLUMNS) and not last):
            raise ValueError(f"{where}: {len(row)} cells, expected {len(COLUMNS)}")
        if not all(row[:FIXED]):
            raise ValueError(f"{where}: an empty cell among the first {FIXED}; its column is unknowable")
        slots = ("immediate", "investigatory", "linkage", "trigger")
        found = dict.fromkeys(slots, "")
        at = 0
        for cell in (c for c in row[FIXED:] if c):
            while at < len(slots) and not _fits(slots[at], cell):
                at += 1
            if at == len(slots):
                raise ValueError(f"{where}: cannot place cell {cell[:60]!r}")
            found[slots[at]] = cell
            at += 1
        records.append(_record(row[1], row[2], row[3], found["immediate"], found["investigatory"],
                               found["linkage"], row[4:8], where))
    return records


# --- the spreadsheet's "Xids" sheet saved as CSV -------------------------------------------

def parse_sheet(text: str) -> list[dict[str, str]]:
    rows = list(csv.reader(io.StringIO(text)))
    heads = [[_norm(c).lower() for c in row] for row in rows]
    at = next((i for i, names in enumerate(heads) if "code" in names and "mnemonic" in names), None)
    if at is None:
        raise ValueError("no header row with Code and Mnemonic columns found")
    names = heads[at]
    index: dict[str, int] = {}
    for column in COLUMNS:
        aliases = (column, "type") if column == "type (xid)" else (column,)
        hits = [i for i, name in enumerate(names) if name in aliases]
        if hits:
            index[column] = hits[0]
        elif column not in ("type (xid)", "trigger conditions"):
            raise ValueError(f"the sheet has no {column!r} column; it has {names}")
    records = []
    for number, row in enumerate(rows[at + 1:], start=at + 2):
        def cell(column: str, row: list[str] = row) -> str:
            i = index.get(column)
            return row[i].strip() if i is not None and i < len(row) else ""

        if not any(c.strip() for c in row) or not cell("code"):
            continue
        if "type (xid)" in index and cell("type (xid)").upper() != "XID":
            continue
        records.append(_record(cell("code"), cell("mnemonic"), cell("description"),
                               cell("resolution bucket (immediate action)"),
                               cell("resolution bucket (investigatory action)"),
                               cell("xid 154 linkage"), [cell(c) for c in COLUMNS[4:8]],
                               f"row {number}"))
    return records


# --- output ------------------------------------------------------------------------------

def is_pipe(text: str) -> bool:
    return any(SEPARATOR.match(line) for line in text.splitlines())


def render(records: list[dict[str, str]], *, retrieved: str, version: str | None, origin: str) -> str:
    seen: set[int] = set()
    for record in records:
        code = int(record["code"])
        if code in seen:
            raise ValueError(f"Xid {code} appears twice")
        seen.add(code)
    out = io.StringIO()
    out.write("# NVIDIA's Xid catalog (Ampere and newer GPUs): NVIDIA's recommended actions per Xid code.\n")
    out.write(f"# source: {SOURCE_URL}\n")
    out.write(f"# catalog version: {version or 'none shown in the copy used'}; retrieved {retrieved} "
              f"from {origin}\n")
    out.write("# derived by: scripts/xid_catalog.py (see docs/xid-catalog.md); regenerate, do not edit by hand\n")
    out.write("# immediate_action is empty where NVIDIA gives no bucket for the code\n")
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(sorted(records, key=lambda r: int(r["code"])))
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path,
                        help="NVIDIA's table: the Xids sheet as CSV, or the page's table as pipe text")
    parser.add_argument("--retrieved", required=True, metavar="YYYY-MM-DD", help="when the input was saved")
    parser.add_argument("--version", help="the catalog's version or date, if the input shows one")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    text = args.input.read_text(encoding="utf-8-sig")
    try:
        if is_pipe(text):
            records, origin = parse_pipe(text), "a stored copy (the page's table as text)"
        else:
            records, origin = parse_sheet(text), "NVIDIA's spreadsheet (Xids sheet saved as CSV)"
        output = render(records, retrieved=args.retrieved, version=args.version, origin=origin)
    except ValueError as e:
        print(f"{args.input}: {e}", file=sys.stderr)
        return 1
    if args.out:
        args.out.write_text(output, encoding="utf-8")
    else:
        sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
