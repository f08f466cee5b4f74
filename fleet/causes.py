"""What a node brings to its job, and the evidence a cause leaves on it, per sample.

Each straggler cause slows the node's job (fleet/physics.py) and leaves its own signature on the
culprit, the one thing that names it (docs/fleet.md has the sources):

- throttle: one GPU's clock below its peers with the driver's reason set and its event time
  rising: `thermal` (SW thermal slowdown; power unchanged), `power_cap` (a GPU whose power limit
  is set low: SW power cap, power at that cap), `power_brake` (an external power brake in short
  episodes that halve the clock; the sampled clock and reason catch a few of them, the brake's
  time counter all);
- nvlink_degraded: recovery events on a link of one GPU (a B200 counts no other NVLink error), or
  the link down;
- fabric_link: an InfiniBand port with symbol errors, link recoveries and transmit wait, or a
  RoCE port with out-of-sequence packets, sequence-error NAKs and ACK timeouts;
- pcie_downgrade: a GPU's link trained to fewer lanes; its NIC runs out of buffer and sends PFC
  pauses (Minder), CNPs and ECN marks grow;
- host_starved: the host cannot feed its GPUs (CPU contention): they sit without a kernel,
  and CPU pressure rises.

Healthy nodes have their noise too: GPUs hitting their power cap under normal load, the odd
symbol error at a compliant bit error rate, a RoCE packet lost now and then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleet import physics
from fleet.scenario import Event

GPUS = 8
NVLINK_LINKS = 18  # a B200's NVLink 5 links
# A B200 counts NVLink recovery events only (NVML's NVLink 5 counters; docs/nvml-simulation.md), and the
# exporter serves them summed over the GPU's links (link="all") by default.
NVLINK_ERROR_TYPES = ("recovery",)
IB_PORTS = 4  # compute-fabric HCAs per node (one per two GPUs here)
IB_RATE = 5e10  # bytes/s: NDR 400 Gb/s
# Causes that slow every node of the job alike (a collective over a degraded link) rather than one node's step.
LINK_CAUSES = ("nvlink_degraded", "fabric_link", "pcie_downgrade")
CULPRIT_CAUSES = ("throttle", *LINK_CAUSES, "host_starved")
# The cause each straggler fault is named by: the `cause` label of the rule pack's alert that names
# its node, and the report's word for it (a job slowed as a whole: job_wide). A throttle's by its
# reason, a fabric link's by its fabric (the fault's param, build()'s default where none is given).
CAUSE: dict[str, str | dict[str, str]] = {
    "throttle": {"thermal": "clock_thermal", "power_cap": "clock_power_cap", "power_brake": "clock_power_brake"},
    "fabric_link": {"infiniband": "fabric_infiniband", "roce": "fabric_roce"},
    "nvlink_degraded": "nvlink_degraded", "pcie_downgrade": "pcie_link_degraded", "host_starved": "host_starved",
    "job_slowdown": "job_wide"}
PARAM = {"throttle": ("reason", "thermal"), "fabric_link": ("fabric", "infiniband")}


def cause(fault: Event) -> str:
    word = CAUSE[fault.kind]
    return word if isinstance(word, str) else word[fault.param(*PARAM[fault.kind])]


@dataclass
class Own:
    """One node's step and counters, from its own faults and distractors (not its job's pace)."""

    step: physics.NodeStep
    clock: np.ndarray  # (gpus, samples): the SM clock a sample reads, as a share of nominal
    busy_power: np.ndarray  # (gpus, samples): each GPU's power while computing, as a share of nominal
    temperature: np.ndarray  # (gpus, samples): degrees C added to the GPU's usual
    reasons: dict[str, np.ndarray] = field(default_factory=dict)  # reason -> (gpus, samples) 0/1 as sampled
    event_seconds: dict[str, np.ndarray] = field(default_factory=dict)  # reason -> (gpus, samples) s per sample
    violation: dict[str, np.ndarray] = field(default_factory=dict)  # policy -> (gpus, samples) s per sample
    nvlink_errors: dict[str, np.ndarray] = field(default_factory=dict)  # type -> (gpus, samples), links summed
    links_up: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (gpus, samples)
    pcie_replays: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (gpus, samples) per sample
    pcie_width: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (gpus, samples)
    pfc_sent: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (samples,) pause frames per second
    congestion: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (samples,) CNP/ECN factor
    ib: dict[str, np.ndarray] = field(default_factory=dict)  # counter -> (ports, samples) per second
    roce: dict[str, np.ndarray] = field(default_factory=dict)  # counter -> (samples,) per second
    cpu_waiting: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (samples,) s/s
    delay: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (samples,) added to the job's step (links)


def build(t: np.ndarray, step: float, rng: np.random.Generator, faults: list[Event], distractors: list[Event],
          active: np.ndarray, drift: np.ndarray, stage_extra: np.ndarray, gc_wait: np.ndarray) -> Own:
    """active: where the node runs a job whose GPUs compute (errors need traffic); drift: the room's
    clock factor for every GPU; stage_extra, gc_wait: its job's pipeline stage and pause, per sample."""
    n = t.size
    ones = np.ones((GPUS, n))
    speed = ones * drift
    work_factor = ones.copy()  # time to compute a step beyond what the clock speed explains
    clock = ones * drift
    busy_power = ones.copy()
    host_wait = gc_wait.copy()
    temperature = np.zeros((GPUS, n))
    reasons = {r: np.zeros((GPUS, n)) for r in ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                                                 "hw_power_brake_slowdown")}
    event_seconds = {r: np.zeros((GPUS, n)) for r in ("sw_thermal_slowdown", "hw_thermal_slowdown",
                                                       "hw_power_brake_slowdown")}
    # Under a heavy training load GPUs meet their power cap now and then (reason set, violation time).
    capped = rng.random((GPUS, n)) < 0.3
    reasons["sw_power_cap"] = (capped & active).astype(float)
    violation = {"power": np.where(active, 0.3 + 0.1 * rng.standard_normal((GPUS, n)), 0.0).clip(0, 1) * step,
                 "thermal": np.zeros((GPUS, n))}
    nvlink_errors = {kind: np.zeros((GPUS, n)) for kind in NVLINK_ERROR_TYPES}
    links_up = ones * NVLINK_LINKS
    pcie_width = ones * 16
    pcie_replays = np.zeros((GPUS, n))
    pfc_sent = (3.0 + rng.gamma(2.0, 1.0, n)) * active
    congestion = np.ones(n)
    # Post-FEC symbol errors at a healthy bit error rate (1e-15: ~1.4 per hour per 400 Gb/s port).
    ib = {"symbol_error": rng.poisson(1e-15 * 8 * IB_RATE * step, (IB_PORTS, n)) / step,
          "link_error_recovery": np.zeros((IB_PORTS, n)),
          "port_transmit_wait": 2e6 * (1 + 0.1 * rng.standard_normal((IB_PORTS, n))).clip(0.5) * active}
    roce = {"out_of_sequence": rng.poisson(0.02 * step, n) / step * active,
            "packet_seq_err": rng.poisson(0.01 * step, n) / step * active,
            "local_ack_timeout_err": np.zeros(n)}
    cpu_waiting = (0.03 + 0.01 * rng.standard_normal(n)).clip(0.005)
    delay = np.zeros(n)

    for d in distractors:
        during = (t >= d.at) & (t < d.at + d.duration("lasts", t[-1] + step))
        if d.kind == "known_slow":  # a slower GPU bin: no reason, no counter, slower for good
            s = physics.speed_for(float(d.param("slowdown", 0.04)))
            speed[:, during] *= s
            clock[:, during] *= s
        if d.kind == "warm_room":
            temperature[:, during] += float(d.param("degrees", 8))
        if d.kind == "power_cap_busy":  # at its power cap most of the time, clocks barely touched
            hit = (rng.random((GPUS, n)) < 0.9) & during & active
            reasons["sw_power_cap"] = np.maximum(reasons["sw_power_cap"], hit)
            violation["power"][:, during & active] = 0.9 * step
            clock[:, during] *= 0.997
            busy_power[:, during] *= 0.98

    for f in faults:
        window = (t >= f.at) & (t < f.at + f.duration("lasts", t[-1] + step))
        on = window & active
        s = float(f.param("slowdown", 0.05))
        g = f.gpu
        if f.kind == "throttle":
            reason = f.param("reason", "thermal")
            if reason == "power_brake":  # episodes at half clock for a share q of each sample's time
                half = 1 / physics.work_at(np.float64(0.5))  # work done per second at half clock
                mean_q = s / (1 - half)  # the share of time braked that makes the job s slower
                q = np.where(on, rng.gamma(4.0, mean_q / 4, n).clip(0, 1), 0.0)
                braked = rng.random(n) < q  # braked at the instant the sample is read
                work_factor[g] = work_factor[g] / (1 - q * (1 - half))
                clock[g] = np.where(braked, clock[g] * 0.5, clock[g])
                busy_power[g] = busy_power[g] * (1 - q / 2)
                for r in ("hw_slowdown", "hw_power_brake_slowdown"):
                    reasons[r][g] = np.maximum(reasons[r][g], braked)
                event_seconds["hw_power_brake_slowdown"][g] += q * step
            else:
                cf = physics.speed_for(s)
                speed[g, window] *= cf
                clock[g, window] *= cf
                if reason == "power_cap":  # power held at a lower limit, which sets the clock
                    busy_power[g, window] *= cf ** 2.5
                    reasons["sw_power_cap"][g] = np.where(on, 1.0, reasons["sw_power_cap"][g])
                    violation["power"][g] = np.where(on, step, violation["power"][g])
                else:  # thermal: as hot as it may run, the same power at a lower clock (leakage grows with heat)
                    reasons["sw_thermal_slowdown"][g] = np.where(on, 1.0, reasons["sw_thermal_slowdown"][g])
                    event_seconds["sw_thermal_slowdown"][g] += on * step
                    violation["thermal"][g] += on * step
                    temperature[g, window] += 22
        elif f.kind == "nvlink_degraded":  # a link that retrains about once a minute
            nvlink_errors["recovery"][g] += np.where(on, rng.poisson(step / 60, n), 0)
            if f.param("link_down", False):
                links_up[g, window] = NVLINK_LINKS - 1
            delay[on] = np.maximum(delay[on], physics.delay_for(s))
        elif f.kind == "fabric_link":
            if f.param("fabric", "infiniband") == "infiniband":
                port = int(f.param("port", 0)) % IB_PORTS
                ib["symbol_error"][port] += np.where(on, rng.poisson(1.5 * step, n), 0) / step
                ib["link_error_recovery"][port] += np.where(on, rng.poisson(step / 240, n), 0) / step
                ib["port_transmit_wait"][port] *= np.where(on, 5.0, 1.0)
            else:
                for counter, per_second in (("out_of_sequence", 40.0), ("packet_seq_err", 8.0),
                                            ("local_ack_timeout_err", 0.5)):
                    roce[counter] = roce[counter] + np.where(on, rng.poisson(per_second * step, n), 0) / step
            delay[on] = np.maximum(delay[on], physics.delay_for(s))
        elif f.kind == "pcie_downgrade":
            pcie_width[g, window] = int(f.param("width", 8))
            pcie_replays[g] += np.where(on, rng.poisson(float(f.param("replays_per_minute", 0)) * step / 60, n), 0)
            pfc_sent = np.where(on, pfc_sent + 800.0 * (1 + 0.3 * rng.standard_normal(n)).clip(0.2), pfc_sent)
            congestion = np.where(window, float(f.param("congestion", 20)), congestion)
            delay[on] = np.maximum(delay[on], physics.delay_for(s))
        elif f.kind == "host_starved":
            host_wait[window] += physics.delay_for(s)
            cpu_waiting = np.where(window, 0.35 + 0.05 * rng.standard_normal(n), cpu_waiting).clip(0.005)

    work = physics.work_at(speed) * work_factor * (1 + stage_extra)
    return Own(physics.NodeStep(work, host_wait), clock, busy_power, temperature, reasons, event_seconds,
               violation, nvlink_errors, links_up, pcie_replays, pcie_width, pfc_sent, congestion, ib, roce,
               cpu_waiting, delay)
