"""The reference node's series: within the budget by default, and docs/series-budget.md's table is the measured one."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from series_budget import BUDGET, measure  # noqa: E402


def test_the_reference_node_is_within_the_budget_and_the_doc_says_so() -> None:
    result = measure()
    default, every = (sum(result[k].values()) for k in ("default", "every_nfs_series"))
    assert default <= BUDGET < every
    doc = (ROOT / "docs" / "series-budget.md").read_text()
    table = re.search(r"<!-- BEGIN series-budget.*?-->\n(.*?)<!-- END", doc, re.S).group(1)
    for collector, count in result["default"].items():
        assert f"| {collector} | {count:,} | {result['every_nfs_series'][collector]:,} |" in table, collector
    assert f"| **total** | **{default:,}** | **{every:,}** |" in table
