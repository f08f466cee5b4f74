"""The node's own clock of its checkpoint saves: seconds spent saving, and saves begun.

Prometheus sees a node's NFS writes only at the scrape: a save shorter than the scrape interval
(the Lablup B200 operations report measured 18-31.7 s against 30 s scrapes) fills one sample,
and a duration estimated from samples reads 0 s. So the exporter keeps the clock itself: a
thread reads mountstats every checkpoint.sample_seconds (1 s) and counts the seconds in which
the node's NFS mounts send WRITE payload faster than checkpoint.save_write_bytes per second,
the rule pack's save threshold. The report and the recordings take increases of these counters
over a save: its duration to within a sample at each end, whatever the scrape interval.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.collector.nfs import read_own_or_init
from gpunode_exporter.problems import Problems
from gpunode_exporter.procfs import mountstats

log = logging.getLogger(__name__)

SAVE_SECONDS = MetricSpec("gpunode_checkpoint_save_seconds_total", "counter",
                          "Seconds this node spent saving a checkpoint: sampled every checkpoint.sample_seconds, "
                          "its NFS mounts sent WRITE payload faster than checkpoint.save_write_bytes per second "
                          "(dips shorter than checkpoint.gap_seconds included).")
SAVES = MetricSpec("gpunode_checkpoint_saves_total", "counter",
                   "Checkpoint saves this node began (runs of the save seconds above).")
SAMPLES = MetricSpec("gpunode_checkpoint_samples_total", "counter",
                     "Reads of mountstats by the checkpoint clock: its rate is 1 / checkpoint.sample_seconds "
                     "while the clock runs.")


@dataclass
class SaveClock:
    """Pure: fed the WRITE bytes each mount has sent so far, at each sample's time."""

    threshold: float  # bytes per second
    gap: float  # seconds: a dip shorter than this does not end a save
    seconds: float = 0.0
    saves: int = 0
    samples: int = 0
    _last: float | None = None
    _bytes: dict[tuple[str, str], int] | None = None
    _saving: bool = False
    _dip: float = 0.0  # seconds below the threshold since the save's last second above it

    def feed(self, now: float, written: Mapping[tuple[str, str], int]) -> None:
        self.samples += 1
        before, last = self._bytes, self._last
        self._bytes, self._last = dict(written), now
        if before is None or last is None or now <= last:
            return
        # per mount, so a mount that leaves (or a counter that restarts) adds nothing
        sent = sum(max(0, n - before[k]) for k, n in written.items() if k in before)
        interval = now - last
        if sent / interval > self.threshold:
            if not self._saving:
                self._saving, self.saves = True, self.saves + 1
            self.seconds += interval + self._dip  # a dip within a save was part of it
            self._dip = 0.0
        elif self._saving:
            self._dip += interval
            if self._dip >= self.gap:
                self._saving, self._dip = False, 0.0


def written_bytes(text: str, mountpoints: list[re.Pattern[str]]) -> dict[tuple[str, str], int]:
    """WRITE payload sent so far per NFS mount (mountpoint, export) of mountstats text."""
    out: dict[tuple[str, str], int] = {}
    for mount in mountstats.parse(text).mounts:
        key = (mount.mountpoint, mount.export)
        if key in out or (mountpoints and not any(p.search(mount.mountpoint) for p in mountpoints)):
            continue
        out[key] = sum(op.sent_bytes for op in mount.operations if op.name == "WRITE")
    return out


@register
class CheckpointCollector(Collector):
    name = "checkpoint"
    description = "The node's own clock of its checkpoint saves (NFS writes read every second)."
    metrics = (SAVE_SECONDS, SAVES, SAMPLES)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        c = ctx.config.checkpoint
        self._clock = SaveClock(c.save_write_bytes, c.gap_seconds)
        self._mountpoints = [re.compile(p) for p in c.mountpoints]
        self._lock = threading.Lock()
        self._problems = Problems()
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-clock", daemon=True)
        self._thread.start()

    def sample(self) -> None:
        """One read of mountstats into the clock; a failed read is skipped (and logged once)."""
        try:
            _pid, text = read_own_or_init(self.ctx.procfs, "mountstats")
        except OSError as err:
            with self._lock:
                self._error = f"mountstats: {err.strerror or err}"
            if self._problems.new("read", self._error):
                log.warning("checkpoint clock: %s (no saves counted while it lasts)", self._error)
            return
        written = written_bytes(text, self._mountpoints)
        with self._lock:
            self._clock.feed(time.monotonic(), written)
            self._error = None
        if self._problems.solved("read"):
            log.info("checkpoint clock: mountstats readable again")

    def _run(self) -> None:
        interval = self.ctx.config.checkpoint.sample_seconds
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as err:  # the clock must outlive any one bad read
                if self._problems.new("sample", str(err)):
                    log.warning("checkpoint clock: sample failed: %s", err)
            next_at = max(next_at + interval, time.monotonic())  # a late sample does not bunch the next
            self._stop.wait(next_at - time.monotonic())

    def collect(self) -> Iterator[Family]:
        with self._lock:
            seconds, saves, samples, error = self._clock.seconds, self._clock.saves, self._clock.samples, self._error
        for spec, value in ((SAVE_SECONDS, seconds), (SAVES, saves), (SAMPLES, samples)):
            family = spec.family()
            family.add((), value)
            yield family
        if error is not None:  # the counts stand, but do not grow while mountstats cannot be read
            raise RuntimeError(error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
