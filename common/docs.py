"""Generated blocks in Markdown: README.md's flag and metric tables, docs/dashboards.md's panels."""

from __future__ import annotations

import re
from collections.abc import Callable

_BLOCK = re.compile(r"(<!-- BEGIN GENERATED: (\w+) -->\n).*?(<!-- END GENERATED: \2 -->)", re.S)


def fill(text: str, generators: dict[str, Callable[[], str]]) -> str:
    """text with each <!-- BEGIN GENERATED: name --> ... <!-- END GENERATED: name --> block's
    body replaced by generators[name]() (README.md here, docs/dashboards.md in dashboards.doc)."""
    return _BLOCK.sub(lambda m: m.group(1) + generators[m.group(2)]() + m.group(3), text)
