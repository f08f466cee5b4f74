"""NVIDIA's Xid catalog: the action NVIDIA recommends for each Xid code.

Why a packaged table: an Xid code alone says little to whoever is paged; NVIDIA's catalog
("Analyzing Xid Errors with the Xid Catalog") gives each code a resolution bucket for the
immediate action (RESTART_APP, RESET_GPU, RESTART_BM, ...), which the exporter attaches to
its Xid series so alerts can route on it. catalog.csv is derived from NVIDIA's table by
scripts/xid_catalog.py and never edited by hand (docs/xid-catalog.md); this module only
reads and checks it. A code missing from it, or one NVIDIA gives no bucket, answers UNKNOWN.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

UNKNOWN = "UNKNOWN"
HEADER = ("code", "mnemonic", "description", "immediate_action", "investigatory_action",
          "xid154_linkage", "a100", "h100", "b100", "gb200")
PRODUCTS = ("A100", "H100", "B100", "GB200")
_ACTION = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class Entry:
    code: int
    mnemonic: str
    description: str
    immediate_action: str  # NVIDIA's bucket token; "" where NVIDIA gives none
    investigatory_action: str  # as NVIDIA writes it; may be free text
    xid154_linkage: str
    applies_to: frozenset[str] = field(default_factory=frozenset)  # of PRODUCTS


class Catalog:
    def __init__(self, entries: Mapping[int, Entry], source: str) -> None:
        self._entries = dict(entries)
        self.source = source

    def entry(self, code: int) -> Entry | None:
        return self._entries.get(code)

    def action(self, code: int) -> str:
        """The immediate-action bucket for `code`, or UNKNOWN."""
        entry = self._entries.get(code)
        return entry.immediate_action if entry is not None and entry.immediate_action else UNKNOWN

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return (self._entries[code] for code in sorted(self._entries))


def parse(text: str) -> Catalog:
    """Our catalog.csv format: '#' comment lines (one may be '# source: ...'), the header, rows.

    Raises ValueError naming the line for a malformed row, a duplicate code, or an
    immediate action that is not an upper-case token. One row per line: no quoted newlines.
    """
    source = ""
    header_seen = False
    entries: dict[int, Entry] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            if key.strip() == "source" and not source:
                source = value.strip()
            continue
        row = next(csv.reader([line]))
        if not header_seen:
            if tuple(row) != HEADER:
                raise ValueError(f"line {number}: expected the header {','.join(HEADER)!r}, got {line!r}")
            header_seen = True
            continue
        entry = _entry(row, number)
        if entry.code in entries:
            raise ValueError(f"line {number}: duplicate code {entry.code}")
        entries[entry.code] = entry
    if not header_seen:
        raise ValueError("no header line")
    return Catalog(entries, source)


def _entry(row: list[str], number: int) -> Entry:
    if len(row) != len(HEADER):
        raise ValueError(f"line {number}: {len(row)} fields, expected {len(HEADER)}")
    code, mnemonic, description, immediate, investigatory, linkage, *flags = row
    if not code.isdigit():
        raise ValueError(f"line {number}: code {code!r} is not a non-negative integer")
    if immediate and not _ACTION.fullmatch(immediate):
        raise ValueError(f"line {number}: immediate action {immediate!r} is not an upper-case token")
    if any(flag not in ("0", "1") for flag in flags):
        raise ValueError(f"line {number}: applies-to flags {flags} are not all 0 or 1")
    applies = frozenset(p for p, flag in zip(PRODUCTS, flags, strict=True) if flag == "1")
    return Entry(int(code), mnemonic, description, immediate, investigatory, linkage, applies)


@functools.cache
def _packaged() -> Catalog:
    return parse(resources.files(__package__).joinpath("catalog.csv").read_text(encoding="utf-8"))


def load(path: Path | None = None) -> Catalog:
    """The catalog at `path`; by default the packaged catalog.csv, read once."""
    if path is None:
        return _packaged()
    return parse(path.read_text(encoding="utf-8"))
