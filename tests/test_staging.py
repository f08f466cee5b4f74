"""Staging filesystems: statvfs as df reports it, on a tmpfs the test mounts; bad paths are logged once."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.staging import StagingCollector
from gpunode_exporter.config import Config, StagingConfig
from tests.helpers import collect_samples


def staging(*paths: str) -> StagingCollector:
    cfg = Config(staging=StagingConfig(paths=paths))
    return StagingCollector(Context(procfs=Path("/proc"), sysfs=Path("/sys"), config=cfg,
                                    route_lookup=lambda _a: None))


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(tmp_path)], check=True)
    try:
        yield tmp_path
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)


def df_bytes(path: Path) -> tuple[int, int]:
    """(size, used) as coreutils df prints them."""
    out = subprocess.run(["df", "-B1", "--output=size,used", str(path)], capture_output=True, text=True,
                         check=True).stdout.split("\n")[1].split()
    return int(out[0]), int(out[1])


def test_used_and_size_match_df(tmpfs: Path) -> None:
    (tmpfs / "shard-00.pt").write_bytes(b"\1" * (3 << 20))
    s = collect_samples(staging(str(tmpfs)))
    size, used = df_bytes(tmpfs)
    assert s["gpunode_staging_size_bytes"] == {(("path", str(tmpfs)),): size} and size == 64 << 20
    assert s["gpunode_staging_used_bytes"] == {(("path", str(tmpfs)),): used} and used == 3 << 20


def test_missing_path_is_left_out_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    c = staging("/nonexistent/stage", "/")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            s = collect_samples(c)
    assert set(s["gpunode_staging_size_bytes"]) == {(("path", "/"),)}
    assert [r.message for r in caplog.records] == [
        "staging path /nonexistent/stage: No such file or directory (its series are left out)"]


def test_default_is_dev_shm() -> None:
    assert Config().staging.paths == ("/dev/shm",)
