"""The exporter's own process_* metrics (exporter/process.py): prometheus_client's names, help,
types and values, read from /proc whatever procfs psutil is pointed at meanwhile."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from gpunode_exporter import process

# How far two readings a moment apart may differ.
SLACK = {"process_start_time_seconds": 0.01, "process_max_fds": 0, "process_open_fds": 2,
         "process_cpu_seconds_total": 0.5, "process_resident_memory_bytes": 8 << 20,
         "process_virtual_memory_bytes": 64 << 20}


def _ours() -> dict[str, tuple[str, str, float]]:
    out = {}
    for family in process.collect():
        [(_, value)] = family.rows
        out[family.spec.name] = (family.spec.help, family.spec.kind, value)
    return out


def _theirs() -> dict[str, tuple[str, str, float]]:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return {f.samples[0].name: (f.documentation, f.type, f.samples[0].value) for f in registry.collect()}


def _close(ours: dict[str, tuple[str, str, float]], theirs: dict[str, tuple[str, str, float]]) -> None:
    assert {n: v[:2] for n, v in ours.items()} == {n: v[:2] for n, v in theirs.items()}
    for name, slack in SLACK.items():
        assert ours[name][2] == pytest.approx(theirs[name][2], abs=slack), name


def test_the_metrics_are_prometheus_clients() -> None:
    _close(_ours(), _theirs())


def test_read_from_proc_whatever_procfs_psutil_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU-process tracker points psutil at --path.procfs while it scans: a host's /proc in a
    # container numbers PIDs in another namespace, and tests scan trees of their own.
    theirs = _theirs()
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    _close(_ours(), theirs)


def test_release_memory_trims_one_scrape_in_trim_every() -> None:
    # A trim after every scrape had the next one fault the freed pages back in.
    trimmed = [process.release_memory() for _ in range(3 * process.TRIM_EVERY)]
    assert sum(trimmed) == (3 if process._MALLOC_TRIM is not None else 0)
