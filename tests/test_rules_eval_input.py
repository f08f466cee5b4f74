"""The rule-evaluation benchmark's input (benchmarks/rules_eval.py): what it writes before the
rules start is what its generator would have served at each moment, and the fleet tier's input
keeps every copy of a node apart."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from rules_eval_bench import backfill, pack, synthetic  # noqa: E402

from fleet import remote_write  # noqa: E402
from tests.test_remote_write import _decode  # noqa: E402


def _served(fleet: synthetic.Fleet, now: float) -> dict[str, float]:
    out = {}
    for line in fleet.render(now).decode().splitlines():
        if not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _key(labels: dict[str, str]) -> str:
    rest = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__")
    return f"{labels['__name__']}{{{rest}}}"


def test_prewritten_samples_are_what_a_scrape_would_have_read() -> None:
    fleet = synthetic.Fleet(6, 8, 61, seed=3)
    times = fleet.epoch + np.array([0.0, 437.5, 3600.0, 86_400.0 * 3])
    written: dict[str, list[float]] = {}
    for fam in fleet.families.values():
        labels, values = fleet.matrix(fam, times)
        request = b"".join(remote_write.encode(labels, values, np.round(times * 1000)))
        for series_labels, samples in _decode(request):
            written[_key(dict(sorted(series_labels.items())))] = [v for v, _ in samples]
    for i, now in enumerate(times):
        served = {_key(dict(sorted(_parse(k).items()))): v for k, v in _served(fleet, now).items()}
        assert served.keys() == written.keys()
        wrong = [k for k, v in served.items() if abs(written[k][i] - v) > 1e-3 * max(1.0, abs(v))]
        assert not wrong, wrong[:5]


def _parse(key: str) -> dict[str, str]:
    name, _, rest = key.partition("{")
    return {"__name__": name, **dict(re.findall(r'(\w+)="([^"]*)"', rest))}


def test_the_fleet_tiers_copies_are_nodes_and_jobs_of_their_own() -> None:
    snapshot = {"nodes": 2, "series": {
        "gpunode:precursor_signal:value": [({"instance": "gpu0001", "job": "gpunode", "signal": "interrupts"}, 1.5),
                                           ({"instance": "gpu0002", "job": "gpunode", "signal": "interrupts"}, 2.0)],
        "gpunode_node_workload_info": [({"instance": "gpu0001", "job": "gpunode", "workload": "train-1",
                                         "source": "slurm"}, 1.0)]}}
    fleet = synthetic.Recordings(snapshot, 6)
    assert fleet.copies == 3 and fleet.series == 9
    now = time.time()
    served = _served(fleet, now)
    nodes = {_parse(k)["instance"] for k in served}
    assert nodes == {"gpu0001", "gpu0002", "gpu0001-1", "gpu0002-1", "gpu0001-2", "gpu0002-2"}
    jobs = {_parse(k).get("workload") for k in served} - {None}
    assert jobs == {"train-1", "train-1-1", "train-1-2"}
    assert served['gpunode:precursor_signal:value{instance="gpu0002-2",job="gpunode",signal="interrupts"}'] == 2.0


def test_recorded_history_is_written_once_per_series() -> None:
    """Retried backfills write only series not written before (with or without the name)."""

    class Backend:
        def __init__(self) -> None:
            self.answers = [
                [{"metric": {"__name__": "m", "instance": "a"}, "value": [0, "1"]}],
                [{"metric": {"instance": "a"}, "value": [0, "1"]},  # the same series, unnamed
                 {"metric": {"__name__": "m", "instance": "b"}, "value": [0, "2"]}],
            ]
            self.written: list[list[dict[str, str]]] = []

        def query(self, _query: str) -> list[dict]:
            return self.answers.pop(0)

        def backfill(self, series: dict, start: float, end: float, step: float) -> int:
            self.written.append([labels for labels, _ in series["m"]])
            return len(series["m"])

    backend, written = Backend(), {}
    plan = {"m": {"tier": "recorded", "step_s": 300.0, "span_s": 3600.0}}
    first = backfill.do_backfill(backend, plan, "recorded", 1000.0, written)  # type: ignore[arg-type]
    second = backfill.do_backfill(backend, plan, "recorded", 1000.0, written)  # type: ignore[arg-type]
    assert (first["m"]["series"], second["m"]["series"]) == (1, 1)
    assert [[labels["instance"] for labels in batch] for batch in backend.written] == [["a"], ["b"]]
    assert len(written["m"]) == 2


def test_recorded_history_is_taken_from_a_range_clear_of_the_rules_first_minutes() -> None:
    """The baselines' 5-minute medians (a node's, a job's) are backfilled only from an evaluation
    whose 5 minutes begin after the peer rules have settled (a median of the rules' first minutes
    would hold a level no node ever had), and the warm-up is long enough for that and one more
    evaluation."""
    import argparse

    reads, recorded, recorded_from, bad = pack.rule_reads("vmalert", 30.0)
    assert not bad
    for median in ("gpunode:failslow_proxy:interval_median", "gpunode:failslow_job:interval_median"):
        assert recorded_from[median] == 300.0  # in_peer_group[5m], peer_median[5m]
    for max_group_interval, run_step in ((60.0, 30.0), (300.0, 300.0)):  # the whole pack; the fleet tier
        args = argparse.Namespace(warmup=300.0, backfill_days=0, scrape_interval=15.0, eval_interval=30.0,
                                  max_group_interval=max_group_interval)
        args.warmup = backfill.warmup_for_recorded_history(reads, recorded, recorded_from, args)
        plan = backfill.backfill_plan(reads, recorded, args, recorded_from)
        median = plan["gpunode:failslow_proxy:interval_median"]
        assert median["tier"] == "recorded" and median["run_step_s"] == run_step
        assert plan["gpunode:failslow_job:interval_median"]["tier"] == "recorded"
        due = backfill.recorded_backfill_after(plan)
        # The group runs at least once in (due - a step, due]: its range starts after the settling...
        assert due - 15 - max(60.0, run_step) - median["reads_s"] >= backfill.RULES_SETTLE_SECONDS
        # ... and the baseline reading the history runs again before the measurement.
        assert args.warmup >= due + max(60.0, run_step)
