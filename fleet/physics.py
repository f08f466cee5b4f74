"""A synchronous job's pace: every step ends in a collective, so every node moves at the slowest's.

Per sample, each node brings its step's work: how long each of its GPUs computes (1 at nominal
speed; longer when its clock is throttled or its pipeline stage has more to do) and how long its
GPUs sit without a kernel waiting for their own host (a starved host, a garbage-collection
pause). The job's step lasts as long as its slowest node's, plus what slows every node alike: a
collective over a degraded link, an input pipeline that cannot keep up. The job's rate (steps per
nominal step) sets the traffic of every node. Within a step each GPU is

- busy computing: full power;
- spinning in the collective, waiting for the slowest (an NCCL kernel is running, so NVML counts
  the GPU busy, NVIDIA/nccl issues 403 and 689): low power;
- idle, no kernel at all (waiting for its host or for data): utilization and power fall.

docs/fleet.md gives the published measurements behind each of these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLOCK_SHARE = 0.8  # of a step's time, the share that scales with the SM clock (the rest: memory, communication)
SPIN_POWER = 0.25  # power of a GPU spinning in a collective, as a share of a computing GPU's
IDLE_POWER = 0.15  # power of a GPU with no kernel running, as a share of a computing GPU's


def work_at(speed: np.ndarray) -> np.ndarray:
    """Time to compute one step's work at a relative clock speed (1: nominal)."""
    return (1 - CLOCK_SHARE) + CLOCK_SHARE / speed


def speed_for(slowdown: float) -> float:
    """The clock speed at which one GPU makes the job `slowdown` slower (0.05: 5 %) when it is the slowest."""
    return CLOCK_SHARE / (1 / (1 - slowdown) - (1 - CLOCK_SHARE))


def delay_for(slowdown: float) -> float:
    """The time added to every step (a share of the nominal step) that makes a job `slowdown` slower."""
    return 1 / (1 - slowdown) - 1


@dataclass
class NodeStep:
    """What one node brings to its job's step, per sample."""

    work: np.ndarray  # (gpus, samples): each GPU's compute time per step, 1 nominal
    host_wait: np.ndarray  # (samples,): time per step its GPUs wait for their own host (no kernel)

    @property
    def time(self) -> np.ndarray:
        """The node's own step time: its slowest GPU (the GPUs of a node meet in a collective too)."""
        return self.work.max(axis=0) + self.host_wait


def step_time(nodes: list[NodeStep], delay: np.ndarray, stall: np.ndarray) -> np.ndarray:
    """The job's step time: its slowest node's, plus what slows every node alike (a collective
    slowed by a link: `delay`; waiting for input data: `stall`)."""
    return np.max([n.time for n in nodes], axis=0) + delay + stall


@dataclass
class Shares:
    """How each GPU of a node spends the job's step (each of shape (gpus, samples), summing to 1)."""

    busy: np.ndarray
    spin: np.ndarray
    idle: np.ndarray

    @property
    def utilization(self) -> np.ndarray:
        """NVML's utilization: the share of time a kernel ran (spinning in a collective counts)."""
        return self.busy + self.spin

    def power(self, busy_power: np.ndarray) -> np.ndarray:
        """Power as a share of a computing GPU's; busy_power is each GPU's while it computes."""
        return busy_power * self.busy + SPIN_POWER * self.spin + IDLE_POWER * self.idle


def shares(node: NodeStep, step: np.ndarray, stall: np.ndarray) -> Shares:
    busy = node.work / step
    idle = np.broadcast_to((node.host_wait + stall) / step, busy.shape)
    return Shares(busy, np.clip(1 - busy - idle, 0, 1), idle)
