#!/usr/bin/env python3
"""GPU collector scrape cost: gpunode-exporter vs a naive pynvml exporter, 8 and 16 simulated GPUs.

    python benchmarks/gpu_scrape.py [--scrapes 2000] [--warmup 50] [--cold 20]

Both run in this process against the same simulated libnvidia-ml (gpunode_exporter.nvmlsim,
a ctypes stand-in for the driver that counts every NVML C call), with the same
values (some remapped rows, a pending remap). Per case and exporter:

* NVML calls per steady-state scrape and for the first (cold) scrape, exact, from
  the simulation's call counter;
* latency of one whole /metrics body (collect + render), time.perf_counter, over
  N scrapes taken in rounds that take each exporter once, rotating who goes first,
  so machine noise hits all alike; the cold scrape is timed separately, on fresh
  objects and a fresh simulation each time;
* exposition bytes and samples.

"ours" = Scraper([GPUCollector(ctx)], 5.0) + Renderer().render(scraper.collect()):
what the server does per request, minus HTTP and the process_* metrics. It reads
the PCI bus in sysfs too (--path.sysfs tests/fixtures/sysfs/dgx-h100), which the
naive exporter does not; "ours, no sysfs" is the same with a sysfs that has no
bus/pci/devices, the NVML path alone. The "naive pynvml" baseline is the common
way to write such an exporter: a prometheus_client custom collector that asks NVML
for everything, static facts included, on every scrape, rendered by generate_latest.

The simulated call costs microseconds; a real driver call costs far more, so the
call counts are the figures that transfer to real hardware and the latencies
measure Python overhead only (see benchmarks/README.md).
Results: tables on stdout and benchmarks/results/gpu_scrape.json.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import yaml
from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    cpu_model,
    cpu_times,
    finish,
    machine_load,
    percentile,
    ratio,
    source_fingerprint,
    summarize,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpunode_common.exposition import Renderer
from gpunode_exporter import nvmlsim
from gpunode_exporter.collector import gpu as ours_gpu
from gpunode_exporter.collector import gpu_straggler
from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.gpu import GPUCollector
from gpunode_exporter.config import Config
from gpunode_exporter.nvmlsim.library import FUNCTIONS, SimulatedNVML
from gpunode_exporter.nvmlsim.scenario import Scenario, build
from gpunode_exporter.scrape import Scraper
from gpunode_exporter.sysfs import pci

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "gpu_scrape.json"
DGX_SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "dgx-h100"
SIM_TIME = 86_400.0  # the simulation's clock stands still: every scrape sees the same values
TIMEOUT = 5.0
# ours_nosysfs: our collector with a sysfs lacking bus/pci/devices (as in some containers), so
# no PCI scan: the NVML path alone, to compare with the naive exporter like for like.
# ours_plain: ours_nosysfs with the reads that name a straggler's cause switched off (no clocks
# event reasons, no field values): the collector as it was before them, timed in the same rounds,
# so what they add is measured side by side rather than across runs of a machine whose speed drifts.
KEYS = ("ours", "ours_nosysfs", "ours_plain", "naive")
LABELS = {"ours": "gpunode-exporter", "ours_nosysfs": "gpunode-exporter, no sysfs PCI scan",
          "ours_plain": "gpunode-exporter, no sysfs PCI scan, without the straggler reads",
          "naive": "naive pynvml"}


def order(i: int) -> tuple[str, ...]:
    """Round i's order: rotated each round, so each goes first (and follows each other) alike."""
    return KEYS[i % len(KEYS):] + KEYS[:i % len(KEYS)]


# --- scenarios ---------------------------------------------------------------------------


def scenario_8() -> dict[str, Any]:
    """The shipped healthy 8x H100 node, plus remapped rows on two GPUs (one remap pending)."""
    data = yaml.safe_load(nvmlsim.example("healthy-h100").read_text())
    data["gpus"][2]["remapped_rows"] = {"correctable": 3, "uncorrectable": 1}
    data["gpus"][5]["remapped_rows"] = {"correctable": 1, "uncorrectable": 2}
    data["gpus"][5]["pending"] = 1
    return data


def scenario_16() -> dict[str, Any]:
    """16 GPUs: the 8 above, and 8 more in PCI domain 0001 (same bus numbers), distinct UUIDs
    and serials, remapped rows on two of the new ones too."""
    data = scenario_8()
    extra = []
    for n, g in enumerate(data["gpus"], start=8):
        extra.append({"uuid": g["uuid"][:-2] + f"{n:02x}", "serial": g["serial"][:-2] + f"{n:02d}",
                      "pci_bus_id": "00000001" + g["pci_bus_id"][8:]})
    extra[1]["remapped_rows"] = {"correctable": 7}
    extra[6]["remapped_rows"] = {"correctable": 2, "uncorrectable": 1}
    data["gpus"] = data["gpus"] + extra
    data["description"] = "16x H100: healthy-h100 twice (second copy in PCI domain 0001), some remaps"
    return data


def sysfs_16(tmp: Path) -> Path:
    """The dgx-h100 sysfs tree with each GPU's directory copied into domain 0001."""
    root = tmp / "sysfs-16"
    shutil.copytree(DGX_SYSFS, root, symlinks=True)  # the tree has the kernel's loops (device -> ..)
    devices = root / "bus" / "pci" / "devices"
    for gpu in pci.nvidia_gpus(DGX_SYSFS):
        shutil.copytree(devices / gpu.address, devices / ("0001" + gpu.address[4:]))
    if len(pci.nvidia_gpus(root)) != 16:
        raise BenchError(f"{root}: expected 16 GPUs on the PCI bus")
    return root


# --- the naive pynvml baseline -----------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NaivePynvmlCollector(Collector):
    """The common way: a prometheus_client custom collector that reads everything every scrape.

    NVML is initialised on the first scrape and kept initialised (as ours is). Each scrape
    asks for the driver version and the device count, then per GPU for a handle, the static
    facts (UUID, name, serial, PCI info, max PCIe generation and width) and the dynamic
    values (remapped rows, row remapper histogram, current PCIe generation and width).
    Metric names, help and labels are ours, so the two expositions are comparable.
    """

    def __init__(self) -> None:
        self.initialised = False

    def collect(self) -> Iterator[Metric]:
        if not self.initialised:
            pynvml.nvmlInit()
            self.initialised = True
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        count = pynvml.nvmlDeviceGetCount()
        g = ours_gpu
        visible = GaugeMetricFamily(g.VISIBLE.name, g.VISIBLE.help, labels=g.VISIBLE.labels)
        visible.add_metric(["nvml"], count)
        fams = {spec.name: (CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily)(
                    spec.name, spec.help, labels=spec.labels)
                for spec in (g.INFO, g.UP, g.REMAPPED_ROWS, g.REMAP_PENDING, g.REMAP_FAILURE, g.REMAP_BANKS,
                             g.LINK_GENERATION, g.LINK_WIDTH)}
        info, up, rows, pending, failure, banks, gen, width = fams.values()
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            name = _text(pynvml.nvmlDeviceGetName(handle))
            serial = _text(pynvml.nvmlDeviceGetSerial(handle))
            bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            max_gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
            max_width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
            corr, unc, remap_pending, remap_failure = pynvml.nvmlDeviceGetRemappedRows(handle)
            hist = pynvml.nvmlDeviceGetRowRemapperHistogram(handle)
            cur_gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
            cur_width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
            ids = [str(i), uuid]
            info.add_metric([*ids, bus_id, name, serial, driver], 1)
            up.add_metric(ids, 1)
            rows.add_metric([*ids, "correctable"], corr)
            rows.add_metric([*ids, "uncorrectable"], unc)
            pending.add_metric(ids, remap_pending)
            failure.add_metric(ids, remap_failure)
            for availability in ("max", "high", "partial", "low", "none"):
                banks.add_metric([*ids, availability], getattr(hist, availability))
            gen.add_metric([*ids, "current"], cur_gen)
            gen.add_metric([*ids, "max"], max_gen)
            width.add_metric([*ids, "current"], cur_width)
            width.add_metric([*ids, "max"], max_width)
        yield visible
        yield from fams.values()

    def close(self) -> None:
        if self.initialised:
            pynvml.nvmlShutdown()
            self.initialised = False


# --- the two exporters as "one /metrics body" functions ----------------------------------


class Target:
    """One exporter under test: scrape() returns one exposition body."""

    def __init__(self, key: str, sysfs: Path) -> None:
        self.key = key
        if key != "naive":
            ctx = Context(procfs=ROOT / "tests" / "fixtures" / "procfs" / "edge", sysfs=sysfs, config=Config(),
                          route_lookup=lambda _a: None)
            self.ctx = ctx
            collector = GPUCollector(ctx)
            if key == "ours_plain":  # empty readings: no NVML call, no row, so no family is rendered
                collector._straggler.read = lambda _device, _ids: gpu_straggler.Reading()  # type: ignore[method-assign]
            self.scraper = Scraper([collector], TIMEOUT)
            self.renderer = Renderer()
            self.scrape: Callable[[], bytes] = lambda: self.renderer.render(self.scraper.collect())
        else:
            self.naive = NaivePynvmlCollector()
            self.registry = CollectorRegistry()  # auto_describe=False: registering does not collect
            self.registry.register(self.naive)
            self.scrape = lambda: generate_latest(self.registry)

    def close(self) -> None:
        if self.key != "naive":
            self.scraper.close(wait=True)
            self.ctx.nvml.close()
        else:
            self.naive.close()


def total_calls(sim: SimulatedNVML) -> int:
    return sum(sim.calls.values())


def timed(target: Target, sim: SimulatedNVML) -> tuple[float, int, bytes]:
    """One scrape: (seconds, NVML calls, body)."""
    before = total_calls(sim)
    start = time.perf_counter()
    body = target.scrape()
    elapsed = time.perf_counter() - start
    return elapsed, total_calls(sim) - before, body


# --- checks ------------------------------------------------------------------------------


def series(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def check_same_values(ours: bytes, naive: bytes, gpus: int) -> list[str]:
    """Every naive sample must be in ours with the same value; returns the names only ours has."""
    o, n = series(ours), series(naive)
    if o.get(("gpunode_scrape_collector_success", (("collector", "gpu"),))) != 1:
        raise BenchError("our gpu collector did not succeed")
    if n[("gpunode_gpus_visible", (("source", "nvml"),))] != gpus:
        raise BenchError(f"naive exporter does not see {gpus} GPUs")
    wrong = [(k, v, o.get(k)) for k, v in n.items() if o.get(k) != v]
    if wrong:
        raise BenchError(f"the exporters disagree on {len(wrong)} samples, e.g. {wrong[:3]}")
    remapped = [v for (name, _), v in n.items() if name == "gpunode_gpu_remapped_rows_total"]
    if not any(remapped):
        raise BenchError("no nonzero remapped rows: the scenario is not what this benchmark wants")
    return sorted({f"{name}{dict(labels)}" if name == "gpunode_gpus_visible" else name
                   for name, labels in o.keys() - n.keys()})


# --- statistics --------------------------------------------------------------------------


def only(values: list[int], what: str) -> int:
    distinct = set(values)
    if len(distinct) != 1:
        raise BenchError(f"{what} varies between scrapes: {sorted(distinct)}")
    return distinct.pop()


# --- one case ----------------------------------------------------------------------------


def run_case(gpus: int, scenario: Scenario, sysfs: Path, no_sysfs: Path, args: argparse.Namespace,
             ) -> dict[str, Any]:
    clock = lambda: SIM_TIME  # noqa: E731
    trees = {"ours": sysfs, "ours_nosysfs": no_sysfs, "ours_plain": no_sysfs, "naive": no_sysfs}

    # Cold: first scrape of a fresh exporter on a fresh simulation (NVML not initialised,
    # pynvml's function-pointer cache empty), alternating who goes first.
    cold: dict[str, dict[str, list[Any]]] = {k: {"s": [], "calls": [], "bytes": []} for k in KEYS}
    cold_by_function: dict[str, dict[str, int]] = {}
    for rep in range(args.cold):
        for key in order(rep):
            sim = nvmlsim.install(scenario, clock)
            target = Target(key, trees[key])
            try:
                elapsed, calls, body = timed(target, sim)
                cold_by_function.setdefault(key, dict(sorted(sim.calls.items())))  # before close()
            finally:
                target.close()
                nvmlsim.uninstall()
            cold[key]["s"].append(elapsed)
            cold[key]["calls"].append(calls)
            cold[key]["bytes"].append(len(body))

    # Steady state: one simulation, all three exporters initialised side by side.
    sim = nvmlsim.install(scenario, clock)
    targets = {k: Target(k, trees[k]) for k in KEYS}
    try:
        first = {k: targets[k].scrape() for k in KEYS}  # the cold scrape, measured above
        ours_only = check_same_values(first["ours"], first["naive"], gpus)
        check_same_values(first["ours_nosysfs"], first["naive"], gpus)
        check_same_values(first["ours_plain"], first["naive"], gpus)
        for i in range(args.warmup):
            for key in order(i):
                targets[key].scrape()
        lat: dict[str, list[float]] = {k: [] for k in KEYS}
        calls: dict[str, list[int]] = {k: [] for k in KEYS}
        sizes: dict[str, list[int]] = {k: [] for k in KEYS}
        bodies: dict[str, bytes] = {}
        for i in range(args.scrapes):
            for key in order(i):
                elapsed, n, body = timed(targets[key], sim)
                lat[key].append(elapsed)
                calls[key].append(n)
                sizes[key].append(len(body))
                bodies[key] = body
        for key in ("ours", "ours_nosysfs", "ours_plain"):  # still the same at the end
            check_same_values(bodies[key], bodies["naive"], gpus)
        by_function = {}
        for key in KEYS:
            before = Counter(sim.calls)
            targets[key].scrape()
            by_function[key] = dict(sorted((Counter(sim.calls) - before).items()))
        # What one simulated NVML call costs through pynvml: the figure to swap for a real driver's.
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        start = time.perf_counter()
        for _ in range(2000):
            pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
        sim_call_us = (time.perf_counter() - start) / 2000 * 1e6
    finally:
        for target in targets.values():
            target.close()
        nvmlsim.uninstall()

    # Our collector also scans the PCI bus in sysfs every scrape (identities cached after the
    # first, as the collector's BusScanner does); the naive one does not.
    scanner = pci.BusScanner(sysfs)
    scanner.scan()
    scan = []
    for _ in range(200):
        start = time.perf_counter()
        scanner.scan()
        scan.append(time.perf_counter() - start)

    out: dict[str, Any] = {"gpus": gpus, "gpus_on_pci_bus": len(pci.nvidia_gpus(sysfs)),
                           "sysfs": str(sysfs.relative_to(ROOT)) if sysfs.is_relative_to(ROOT) else
                           "temporary copy of dgx-h100 with the 8 GPU directories duplicated into domain 0001",
                           "ours_pci_sysfs_scan_p50_ms": percentile(scan, 0.5) * 1000,
                           "simulated_nvml_call_us": sim_call_us,
                           "series_only_in_ours": ours_only, "exporters": {}}
    for key in KEYS:
        samples = sum(1 for line in bodies[key].decode().splitlines() if line and not line.startswith("#"))
        out["exporters"][key] = {
            "label": LABELS[key],
            "nvml_calls_per_scrape": only(calls[key], f"{key}: NVML calls per scrape"),
            "nvml_calls_per_scrape_by_function": by_function[key],
            "nvml_calls_cold": only(cold[key]["calls"], f"{key}: NVML calls of the cold scrape"),
            "nvml_calls_cold_by_function": cold_by_function[key],
            "cold_scrape": {"repetitions": args.cold, **summarize(cold[key]["s"])},
            "steady": {"scrapes": args.scrapes, **summarize(lat[key])},
            # Ours varies by a few bytes: its collector duration gauge is a float.
            "bytes": round(percentile(sizes[key], 0.5)),
            "bytes_min_max": [min(sizes[key]), max(sizes[key])],
            "bytes_cold": round(percentile(cold[key]["bytes"], 0.5)),
            "samples": samples,
        }
    return out


# --- machine, report ---------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "nvidia_ml_py_version": importlib.metadata.version("nvidia-ml-py"),
        "prometheus_client_version": importlib.metadata.version("prometheus-client"),
        "gc_enabled": gc.isenabled(),
        "loadavg_start": os.getloadavg(),
    }


def table(case: dict[str, Any]) -> str:
    e = case["exporters"]
    o, x, n = e["ours"], e["ours_nosysfs"], e["naive"]

    def row(label: str, get: Callable[[dict[str, Any]], float], fmt: str) -> str:
        a, b, c = get(o), get(x), get(n)
        return f"| {label} | {a:{fmt}} | {b:{fmt}} | {c:{fmt}} | {ratio(a, c):.2f}x | {ratio(b, c):.2f}x |"

    rows = [row("NVML calls per scrape (steady state)", lambda d: d["nvml_calls_per_scrape"], "d"),
            row("NVML calls, first (cold) scrape", lambda d: d["nvml_calls_cold"], "d")]
    rows += [row(f"{label} latency (ms)", lambda d, k=k: d["steady"][k], ".3f")
             for k, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("mean_ms", "mean"))]
    rows.append(row(f"cold scrape latency, median of {o['cold_scrape']['repetitions']} (ms)",
                    lambda d: d["cold_scrape"]["p50_ms"], ".3f"))
    rows += [row("exposition bytes (median)", lambda d: d["bytes"], ","), row("samples", lambda d: d["samples"], "d")]
    head = [f"| {case['gpus']} GPUs ({case['gpus_on_pci_bus']} on the PCI bus), {o['steady']['scrapes']} scrapes "
            "each | gpunode-exporter | ours, no sysfs | naive pynvml | ours/naive | no-sysfs/naive |",
            "|---|---:|---:|---:|---:|---:|"]
    return "\n".join(head + rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--scrapes", type=int, default=2000, help="measured scrapes per exporter and case (default 2000)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up scrapes each (default 50)")
    p.add_argument("--cold", type=int, default=20, help="cold scrapes each, on fresh objects (default 20)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = p.parse_args(argv)
    if not 1 <= args.scrapes <= 1_000_000 or not 0 <= args.warmup <= 100_000 or not 1 <= args.cold <= 1000:
        p.error("--scrapes must be 1..1000000, --warmup 0..100000, --cold 1..1000")

    results: dict[str, Any] = {
        "scrapes": args.scrapes, "warmup": args.warmup, "cold_repetitions": args.cold,
        "what": {"ours": "Scraper([GPUCollector(ctx)], 5.0) + Renderer().render(scraper.collect())",
                 "ours_nosysfs": "the same with Context.sysfs an empty directory: no PCI scan",
                 "ours_plain": "ours_nosysfs with the straggler reads (clocks event reasons, field values) off: "
                               "the collector before them, in the same rounds",
                 "naive": "prometheus_client custom collector reading every NVML value each scrape "
                          "+ generate_latest(registry)",
                 "nvml": "gpunode_exporter.nvmlsim: ctypes callbacks standing in for libnvidia-ml; not a real driver"},
        "machine": machine_info(), "exporter_source_sha256": source_fingerprint(), "cases": {}}
    start, cpu_before = time.monotonic(), cpu_times()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-scrape-bench-") as tmp:
            no_sysfs = Path(tmp) / "no-sysfs"  # exists, but has no bus/pci/devices
            no_sysfs.mkdir()
            for gpus, data, sysfs in ((8, scenario_8(), DGX_SYSFS), (16, scenario_16(), sysfs_16(Path(tmp)))):
                case = run_case(gpus, build(data, FUNCTIONS), sysfs, no_sysfs, args)
                results["cases"][str(gpus)] = case
                print(table(case), end="\n\n", flush=True)
    except BenchError as err:
        sys.stderr.write(f"gpu_scrape: FAILED: {err}\n")
        return 1
    results["wall_seconds"] = round(time.monotonic() - start, 1)
    results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["exporter_source_changed_during_run"] = source_fingerprint() != results["exporter_source_sha256"]

    for gpus, case in results["cases"].items():
        e = case["exporters"]
        added = e["ours_nosysfs"]["steady"]["p50_ms"] - e["ours_plain"]["steady"]["p50_ms"]
        case["straggler_reads_added_p50_ms"] = added
        print(f"{gpus} GPUs: the straggler reads add {added:+.3f} ms p50 ({e['ours_plain']['nvml_calls_per_scrape']} "
              f"-> {e['ours_nosysfs']['nvml_calls_per_scrape']} NVML calls, {e['ours_plain']['samples']} -> "
              f"{e['ours_nosysfs']['samples']} samples), side by side in the same rounds")
        print(f"{gpus} GPUs: ours also reads sysfs every scrape (PCI scan p50 "
              f"{case['ours_pci_sysfs_scan_p50_ms']:.3f} ms, included in its latency); one simulated NVML call "
              f"through pynvml {case['simulated_nvml_call_us']:.1f} us; series only ours "
              f"serves: {', '.join(case['series_only_in_ours'])}")
    m = results["machine"]
    return finish(results, args.output,
                  f"{m['nproc']} CPUs ({m['cpu_model']}), Python {m['python_version']}, nvidia-ml-py "
                  f"{m['nvidia_ml_py_version']}, prometheus_client {m['prometheus_client_version']}")


if __name__ == "__main__":
    sys.exit(main())
