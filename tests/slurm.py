"""The real Slurm cluster of demo/slurm.py for the tests: skipped where Slurm or root is missing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from demo.slurm import DEFAULT_NODES, SlurmCluster, _tool, flags, parse, slurm_unavailable

__all__ = ["DEFAULT_NODES", "SlurmCluster", "_tool", "flags", "parse", "skip_without_slurm", "slurm_cluster"]


def skip_without_slurm() -> None:
    if reason := slurm_unavailable():
        pytest.skip(reason)


def slurm_cluster(tmp_path_factory: pytest.TempPathFactory, **kwargs: Any) -> Iterator[SlurmCluster]:
    """For a fixture: `yield from slurm_cluster(tmp_path_factory)`; skips when Slurm or root is missing."""
    skip_without_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), **kwargs) as cluster:
        yield cluster
