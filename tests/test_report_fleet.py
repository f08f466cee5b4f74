"""The operational report on real backends: scored against simulated fleets whose truth is known
(`python -m fleet --report`, fleet/report_score.py), the operations report's published checkpoint
figures recovered, and a backend that refuses or holds nothing answered in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import harness
from fleet.__main__ import main as fleet_main
from gpunode_common.http import free_port
from gpunode_report.source import parse_time
from tests.helpers import wait_for_port

# A rule replay runs one vmalert per CPU (fleet/harness.py): one replay at a time.
pytestmark = [pytest.mark.xdist_group("replay"),
              pytest.mark.skipif(bool(harness.missing_tools()),
                                 reason="scripts/install-deps.sh --test installs Prometheus and VictoriaMetrics")]


def _scored(tmp_path: Path, name: str, backend: str, *flags: str) -> tuple[dict, list[str]]:
    code = fleet_main(["--scenario", name, "--backend", backend, "--workdir", str(tmp_path / "work"),
                       "--report", str(tmp_path / "report"), *flags])
    out = tmp_path / "report"  # one scenario on one backend: into DIR itself
    lines = (out / "score.txt").read_text().splitlines()
    assert code == 0, "\n".join(line for line in lines if line.startswith("FAIL"))
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.json", "goodput.png"}
    return json.loads((out / "report.json").read_text()), lines


def test_a_shared_fleet_with_a_restart_and_stragglers(tmp_path: Path) -> None:
    """fleet/scenarios/shared-selftest.yaml: job a ends, job b fails and restarts 11 min later then
    slows as a whole, a single-node session's GPU throttles."""
    report, lines = _scored(tmp_path, "shared-selftest", "victoriametrics")
    assert len(lines) > 20 and not [line for line in lines if line.startswith("FAIL")]
    assert sorted((s["node"], s["cause"]) for s in report["stragglers"]) == [("", "job_wide"),
                                                                             ("gpu012", "clock_thermal")]
    assert sorted(j["attempts"] for j in report["jobs"]) == [1, 1, 2]
    # job b's failure is the scenario's own (no hardware event): no culprit, its first attempt's
    # hour on 6 nodes of 8 GPUs spent
    [b] = [j for j in report["jobs"] if j["failed_attempts"]]
    assert [a["node"] for a in b["failed_attempts"]] == [None] and b["failed_gpu_hours"] == pytest.approx(48, abs=0.5)


def test_a_small_jobs_straggler_is_named_on_the_culprit_not_its_neighbours(tmp_path: Path) -> None:
    """fleet/scenarios/small-jobs.yaml: in two 4-node jobs (each node against its own past, its
    neighbours slowing with the culprit) a power-braked GPU, a thermally throttled one, a RoCE
    link and a GPU at a power limit set low (every busy GPU meets its cap now and then), each
    listed once on its own node with its cause by name."""
    report, lines = _scored(tmp_path, "small-jobs", "victoriametrics")
    assert len(lines) > 20 and not [line for line in lines if line.startswith("FAIL")]
    listed = sorted((s["start"], s["node"], s["cause"]) for s in report["stragglers"])  # the last two from 6h15m
    assert [(node, cause) for _start, node, cause in listed] == [
        ("gpu001", "clock_power_brake"), ("gpu006", "clock_thermal"), ("gpu002", "fabric_roce"),
        ("gpu005", "clock_power_cap")]


def test_hardware_events_on_prometheus(tmp_path: Path) -> None:
    """fleet/scenarios/selftest.yaml on Prometheus: node 4's Xid 79 (with 145, the GPU lost)."""
    report, _lines = _scored(tmp_path, "selftest", "prometheus")
    assert {(f["node"], f["kind"], f["xid"]) for f in report["failures"]} == {
        ("gpu004", "xid", 79), ("gpu004", "xid", 145), ("gpu004", "gpu_lost", None)}
    xid79 = next(f for f in report["failures"] if f["xid"] == 79)
    assert xid79["action"] == "RESTART_BM"
    # the Xid's own timestamp, to the second (2h into the range, which starts on the hour)
    assert parse_time(xid79["time"], 0) == parse_time(report["from"], 0) + 2 * 3600


@pytest.mark.parametrize(("scenario", "backend", "spec"), [
    ("saves-15s", "victoriametrics", None), ("saves-30s", "prometheus", None),
    ("saves-60s", "victoriametrics", "scrape-60s.yaml")])
def test_saves_shorter_and_longer_than_a_scrape_are_timed(tmp_path: Path, scenario: str, backend: str,
                                                          spec: str | None) -> None:
    """fleet/scenarios/saves-*.yaml: saves of 5 s, 30 s and 4 min at 15, 30 and 60 s scrapes, each
    held to its true length (the scorer: within 2 s per save, the Young/Daly optimum within 3 %) by
    the nodes' own clock; a job on exporters without it says its saves were estimated."""
    flags = ["--spec", str(Path(fleet_main.__code__.co_filename).parent / "specs" / spec)] if spec else []
    report, lines = _scored(tmp_path, scenario, backend, *flags)
    assert sum("Young/Daly optimum" in line for line in lines) == 3
    timed = {j["name"]: j["checkpoint"] for j in report["jobs"]}
    assert sorted(c["save_clock"] for c in timed.values()) == ["node", "node", "node", "scrapes"]
    assert sorted(round(c["save_seconds"]) for c in timed.values() if c["save_clock"] == "node") == [5, 30, 240]


def test_the_operations_reports_checkpoint_figures_are_recovered(tmp_path: Path) -> None:
    """fleet/scenarios/checkpoints.yaml: the Lablup B200 operations report's three configurations.
    Published: MTBF 56.2 h; optima 44.9 / 59.7 / 58.1 min; costs 2.20 / 3.22 / 1.82 %, 1.72 % at the
    100K optimum. Its saves of 18, 31.7 and 30 s are timed by the nodes' own clock, to the second
    at 30 s scrapes, so the optimum (its square root) is known to within ~3 %. Its storage: a save's
    WRITE 1,621 ms, 1,495 of them waiting for one of 128 RPC slots, a load's READ 59 ms, 31.5 of
    them waiting, the link at 1.4 and 10.4 %: the slots named the bottleneck."""
    report, lines = _scored(tmp_path, "checkpoints", "victoriametrics")
    assert report["mtbf"]["abnormal_ends"] == 3
    found = [j["checkpoint"] for j in report["jobs"]]
    assert [c["save_seconds"] for c in found] == pytest.approx([18, 31.7, 30], abs=1)
    assert {c["save_clock"] for c in found} == {"node"}
    assert [c["mtbf_seconds"] / 3600 for c in found] == pytest.approx([56.2] * 3, abs=0.05)
    assert [c["interval_seconds"] / 60 for c in found] == pytest.approx([133.5, 199, 81.5], abs=0.1)
    assert [c["optimal_interval_seconds"] / 60 for c in found] == pytest.approx([44.9, 59.7, 58.1], rel=0.03)
    assert [c["cost_fraction"] for c in found] == pytest.approx([0.0220, 0.0322, 0.0182], abs=0.0003)
    assert found[2]["optimal_cost_fraction"] == pytest.approx(0.0172, abs=0.0003)
    assert [c["load_seconds"] for c in found] == [33 * 60] * 3
    lost = [j["seconds"]["lost_progress"] for j in report["jobs"]]
    assert sum(lost) / 3 / 3600 == pytest.approx(0.98, abs=0.02)  # the report's progress lost per failure
    # Its storage (Table 13 of the operations report): the scorer held the storage section to it
    held = [line for line in lines if line[5:].startswith("storage")]
    assert len(held) == 14 and all(line.startswith("ok") for line in held), held
    st = report["storage"]
    write, read = st["save"]["operations"]["WRITE"], st["load"]["operations"]["READ"]
    assert (write["execute_seconds"], write["queue_seconds"]) == pytest.approx((1.621, 1.495), rel=0.05)
    assert (read["execute_seconds"], read["queue_seconds"]) == pytest.approx((0.059, 0.0315), rel=0.05)
    assert st["slots_bottleneck"] == ["save", "load"] and st["load"]["slot_table_full_fraction"] > 0.95
    text = (tmp_path / "report" / "report.md").read_text()
    assert "RPC slot table is the bottleneck during saves and loads" in text and "nconnect=" in text


@pytest.fixture
def empty_vm(tmp_path: Path, request: pytest.FixtureRequest):
    port = free_port()
    limit = getattr(request, "param", 30000)
    with (tmp_path / "vm.log").open("wb") as log:
        proc = subprocess.Popen(["victoria-metrics", f"-storageDataPath={tmp_path / 'vm'}",
                                 f"-httpListenAddr=127.0.0.1:{port}", f"-search.maxPointsPerTimeseries={limit}"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(20)


def _report(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpunode_exporter", "report", "--prometheus.url", url, "--from=-2d",
                           "--output", str(out)], capture_output=True, text=True, timeout=120)


def test_a_range_with_no_data_is_one_line_and_exit_2(empty_vm: str, tmp_path: Path) -> None:
    done = _report(empty_vm, tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no gpunode-exporter data in that range" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("empty_vm", [100], indirect=True)
def test_a_backend_that_refuses_a_query_is_one_line_and_exit_2(empty_vm: str, tmp_path: Path) -> None:
    """VictoriaMetrics with -search.maxPointsPerTimeseries=100 refuses the report's range queries."""
    done = _report(empty_vm, tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{empty_vm} refused" in done.stderr and "HTTP 4" in done.stderr
