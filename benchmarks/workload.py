"""What workload discovery adds to a gpu_processes scrape, side by side with the same collector without it.

    python benchmarks/workload.py [--processes 2000] [--gpu 16] [--scrapes 300]

A procfs tree in the kernel's formats (tests/fakeproc.py) on tmpfs: `--processes` processes, of
which `--gpu` hold /dev/nvidiaN (two per GPU of 8) inside a Slurm job's cgroup with torchrun's
environment; the simulated NVML maps minors to indices. Two collectors scrape it alternately, one
with the shipped workload sources and one with `workload.sources: []`; both are warmed first (the
first scan classifies every process). Target: at most 1 ms added to the p50 at 2,000 processes.
Results: benchmarks/results/workload.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import benchlib  # noqa: E402
from gpunode_exporter.collector.base import Context  # noqa: E402
from gpunode_exporter.collector.gpu_processes import GPUProcessesCollector  # noqa: E402
from gpunode_exporter.config import Config, WorkloadConfig  # noqa: E402
from gpunode_exporter.nvml import Session  # noqa: E402
from tests.fakeproc import FakeProc  # noqa: E402
from tests.helpers import render, simulated_nvml  # noqa: E402

SCENARIO = ROOT / "exporter" / "nvmlsim" / "scenarios" / "healthy-h100.yaml"
SLURM = (ROOT / "tests" / "fixtures" / "cgroup" / "slurm-v2.cgroup").read_bytes()
LOGIN = (ROOT / "tests" / "fixtures" / "cgroup" / "login-session.cgroup").read_bytes()


def build(root: Path, processes: int, gpu: int) -> None:
    proc = FakeProc(root, uptime=86_400.0)
    environ = b"PATH=/usr/bin\0TORCHELASTIC_RUN_ID=run-7\0" + b"X=" + b"y" * 2000 + b"\0"
    for n in range(processes):
        pid = 1000 + n
        if n < gpu:
            proc.spawn(pid, start_s=3_600, gpu=True, cgroup=SLURM, environ=environ)
            (root / str(pid) / "fd" / "6").unlink()
            (root / str(pid) / "fd" / "6").symlink_to(f"/dev/nvidia{n % 8}")
        else:
            proc.spawn(pid, start_s=100, cgroup=LOGIN)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2000)
    p.add_argument("--gpu", type=int, default=16)
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "workload.json")
    args = p.parse_args(argv)
    fingerprint, began, cpu = benchlib.source_fingerprint(), time.monotonic(), benchlib.cpu_times()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp, simulated_nvml(SCENARIO):
        root = Path(tmp)
        build(root, args.processes, args.gpu)
        session = Session()
        collectors = {
            "with_workload": GPUProcessesCollector(Context(root, root, Config(), lambda _a: None, session)),
            "without": GPUProcessesCollector(Context(root, root, Config(workload=WorkloadConfig(sources=())),
                                                     lambda _a: None, session)),
        }
        times: dict[str, list[float]] = {k: [] for k in collectors}
        for c in collectors.values():
            render(c.collect())  # first scan: every process classified
        body = render(collectors["with_workload"].collect())
        assert 'gpunode_node_workload_info{source="slurm",workload="4242"} 1' in body, body
        for _ in range(args.scrapes):
            for key, c in collectors.items():
                start = time.perf_counter()
                render(c.collect())
                times[key].append(time.perf_counter() - start)
    summary = {k: benchlib.summarize(v) for k, v in times.items()}
    added = summary["with_workload"]["p50_ms"] - summary["without"]["p50_ms"]
    print(f"{args.processes} processes, {args.gpu} on GPUs, {args.scrapes} scrapes each, alternating")
    for key, s in summary.items():
        print(f"  {key:14s} p50 {s['p50_ms']:.3f} ms  p90 {s['p90_ms']:.3f} ms  max {s['max_ms']:.3f} ms")
    print(f"  added p50: {added:+.3f} ms (target <= 1 ms): {'met' if added <= 1 else 'MISSED'}")
    results = {"args": vars(args) | {"output": str(args.output)}, "scrapes": summary, "added_p50_ms": added,
               "target_met": added <= 1.0, "wall_seconds": round(time.monotonic() - began, 1),
               "exporter_source_changed_during_run": benchlib.source_fingerprint() != fingerprint,
               "machine": {"cpu": benchlib.cpu_model(), "during_run": benchlib.machine_load(cpu, benchlib.cpu_times())}}
    return benchlib.finish(results, args.output, benchlib.cpu_model())


if __name__ == "__main__":
    raise SystemExit(main())
