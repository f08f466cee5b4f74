"""Checkpoint staging filesystems (default /dev/shm, which node_exporter's filesystem collector hides)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.problems import Problems

log = logging.getLogger(__name__)

USED = MetricSpec("gpunode_staging_used_bytes", "gauge",
                  "Bytes used on a checkpoint staging filesystem (as df counts them; tmpfs uses memory).",
                  ("path",))
SIZE = MetricSpec("gpunode_staging_size_bytes", "gauge", "Size of a checkpoint staging filesystem.", ("path",))


@register
class StagingCollector(Collector):
    name = "staging"
    description = "Used and total bytes of checkpoint staging paths (staging.paths; default /dev/shm)."
    metrics = (USED, SIZE)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._problems = Problems()  # per path

    def collect(self) -> Iterator[Family]:
        used, size = USED.family(), SIZE.family()
        for path in self.ctx.config.staging.paths:
            try:
                st = os.statvfs(path)
            except OSError as err:
                if self._problems.new(path, err.strerror or str(err)):
                    log.warning("staging path %s: %s (its series are left out)", path, err.strerror)
                continue
            self._problems.solved(path)
            size.add((path,), st.f_blocks * st.f_frsize)
            used.add((path,), (st.f_blocks - st.f_bfree) * st.f_frsize)
        yield used
        yield size
