"""Load a simulated fleet into a real backend and replay the rule pack over the whole range.

Two backends, each a real server from Debian's packages:
- prometheus: the series backfilled as TSDB blocks (`promtool tsdb create-blocks-from
  openmetrics`), Prometheus serving them with its remote-write receiver on;
- victoriametrics: the series imported through /api/v1/import.
On both, vmalert's replay mode steps through the range at each group's interval, asks the
backend's own query engine (PromQL in Prometheus, MetricsQL in VictoriaMetrics) for every
rule, honours `for:`, and writes recording rules and ALERTS back through remote write, so
later rules read earlier ones. The rules are the pack's vmalert target (vmalert 1.79 rejects
keep_firing_for, which is therefore not measured).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml

from exporter.nvmlsim.scenario import seconds
from exporter.rulepack import load_spec, render
from fleet.simulate import Fleet, Series

BACKENDS = ("prometheus", "victoriametrics")
# promtool holds a whole file's series in memory: one file of the 60-node week (26 GB of text)
# had grown it to 13.5 GB RSS with no block written after 5 min; 5 nodes take 2.3 GB.
NODES_PER_BACKFILL = 5
# Without it promtool cuts 2 h blocks and parses the whole file once per block (quadratic):
# a 5-node week took over 370 s, with it 45 s. 486 h is the largest block range Prometheus
# compacts to (2 h x 3^5), so a week is one or two blocks per file.
MAX_BLOCK = "486h"
PARALLEL_BACKFILLS = 2
TOOLS = {"prometheus": ("prometheus", "promtool"), "victoriametrics": ("victoria-metrics",), "vmalert": ("vmalert",)}


@dataclass(frozen=True)
class Firing:
    alertname: str
    labels: dict[str, str]
    start: float  # unix seconds of the first firing evaluation of an episode
    end: float  # of the last


def missing_tools() -> list[str]:
    return [tool for tools in TOOLS.values() for tool in tools if shutil.which(tool) is None]


def _labels(series: Series) -> str:
    return ",".join(f'{k}="{v}"' for k, v in series.labels)


def write_openmetrics(series: Iterable[Series], timestamps: np.ndarray, path: Path) -> int:
    """OpenMetrics text for promtool, samples in time order per series; returns the sample count."""
    stamps = [f"{ts:.0f}" for ts in timestamps]
    count = 0
    with path.open("w") as out:
        for s in series:
            prefix = f"{s.name}{{{_labels(s)}}} "
            keep = ~np.isnan(s.values)
            values = [repr(float(v)) for v in s.values[keep]]
            out.write("\n".join(prefix + v + " " + ts for v, ts in zip(values, np.asarray(stamps)[keep], strict=True)))
            out.write("\n")
            count += len(values)
        out.write("# EOF\n")
    return count


def write_vm_import(series: Iterable[Series], timestamps: np.ndarray, path: Path) -> int:
    """VictoriaMetrics' JSON line import format: one line per series."""
    millis = (timestamps * 1000).astype(np.int64)
    count = 0
    with path.open("w") as out:
        for s in series:
            keep = ~np.isnan(s.values)
            metric = {"__name__": s.name, **dict(s.labels)}
            out.write(json.dumps({"metric": metric, "values": s.values[keep].tolist(),
                                  "timestamps": millis[keep].tolist()}) + "\n")
            count += int(keep.sum())
    return count


def _backfill(fleet: Fleet, workdir: Path, data: Path) -> int:
    """The fleet as TSDB blocks in data, NODES_PER_BACKFILL nodes per promtool run; the next
    file is written while earlier ones are converted. The blocks overlap in time, which
    Prometheus merges at query time."""
    running: list[tuple[subprocess.Popen[bytes], Path]] = []

    def reap(keep: int) -> None:
        while len(running) > keep:
            proc, text = running.pop(0)
            _, err = proc.communicate()
            text.unlink()
            if proc.returncode != 0:
                raise RuntimeError(f"promtool backfill of {text.name} failed: {err.decode()[-2000:]}")

    samples = 0
    for first in range(0, fleet.s.nodes, NODES_PER_BACKFILL):
        text = workdir / f"series-{first:04d}.om"
        samples += write_openmetrics(fleet.series(range(first, min(first + NODES_PER_BACKFILL, fleet.s.nodes))),
                                     fleet.timestamps, text)
        reap(PARALLEL_BACKFILLS - 1)
        running.append((subprocess.Popen(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", f"--max-block-duration={MAX_BLOCK}",
             "--quiet", str(text), str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), text))
    reap(0)
    return samples


def _wait(url: str, proc: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).ok:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {seconds:.0f} s")


@contextlib.contextmanager
def _server(argv: list[str], ready: str, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(ready, proc)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


@dataclass
class Run:
    backend: str
    firing: list[Firing]
    seconds_load: float
    seconds_replay: float
    samples: int


def run(backend: str, fleet: Fleet, workdir: Path, port: int, spec_path: Path | None = None) -> Run:
    """Load the fleet into backend, replay the rule pack, return the alert episodes."""
    shutil.rmtree(workdir, ignore_errors=True)  # a stale data directory would add its series twice
    workdir.mkdir(parents=True)
    rules = workdir / "rules"
    rules.mkdir(exist_ok=True)
    spec = load_spec(spec_path)
    rule_files = [_without_annotations(yaml.safe_load(text)) for text in render(spec, "vmalert").values()]
    began = time.monotonic()
    url = f"http://127.0.0.1:{port}"
    if backend == "prometheus":
        data = workdir / "prometheus-data"
        samples = _backfill(fleet, workdir, data)
        config = workdir / "prometheus.yml"
        # Recording rules and ALERTS arrive by remote write with past timestamps: accept them.
        window = int(fleet.s.duration // 3600 + 48)
        config.write_text("global: {scrape_interval: 30s}\n"
                          f"storage: {{tsdb: {{out_of_order_time_window: {window}h}}}}\n")
        server = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                  f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                  "--storage.tsdb.retention.time=10y", "--query.lookback-delta=5m",
                  # as -search.maxQueryDuration below: a replay range query over days of 60+ nodes
                  # (the fail-slow peer median) passed the default 2 minutes on a busy machine
                  "--query.timeout=10m"]
        write_url, ready = url, f"{url}/-/ready"  # vmalert appends /api/v1/write
    else:
        data = workdir / "vm-data"
        server = ["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
                  "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s",
                  # one replay write holds up to 1000 series x 10,000 points: more than the default 32 MB
                  "-maxInsertRequestSize=1GB",
                  # a replay range query of a 3-hour quantile_over_time per node (GpuNodeSlowingDown) took > 30 s
                  "-search.maxQueryDuration=600s"]
        write_url, ready = url, f"{url}/health"
        samples = 0
    with _server(server, ready, workdir / f"{backend}.log"):
        if backend == "victoriametrics":
            lines = workdir / "series.jsonl"
            samples = write_vm_import(fleet.series(), fleet.timestamps, lines)
            with lines.open("rb") as body:
                requests.post(f"{url}/api/v1/import", data=body, timeout=3600).raise_for_status()
            requests.get(f"{url}/internal/force_flush", timeout=60)
            lines.unlink()
        loaded = time.monotonic()
        end = fleet.timestamps[-1] + fleet.s.step
        # One rule at a time, in the pack's order, each replay's output flushed before the next
        # starts: a rule then reads every earlier rule's complete output. (With all rules in one
        # replay, VictoriaMetrics had not yet made new recordings searchable when the next rule
        # of the group asked, even 3 s later, and the fail-slow ratios came out empty.)
        log = []
        for n, rule in enumerate(_one_rule_files(rule_files)):
            path = rules / f"rule-{n:03d}.yml"
            path.write_text(yaml.safe_dump(rule, sort_keys=False))
            for begin, until in _spans(rule, fleet.timestamps[0], end):
                replay = subprocess.run(
                    ["vmalert", f"-rule={path}", f"-datasource.url={url}", f"-remoteWrite.url={write_url}",
                     f"-replay.timeFrom={_rfc3339(begin)}", f"-replay.timeTo={_rfc3339(until)}",
                     f"-replay.maxDatapointsPerQuery={REPLAY_POINTS[backend]}", "-replay.rulesDelay=0s",
                     "-replay.disableProgressBar",
                     "-remoteWrite.flushInterval=100ms", "-datasource.lookback=0s", "-loggerLevel=WARN",
                     # the rule's interval as the range query's step: the default (5m) evaluated every
                     # rule on a 5-minute grid, which delayed each for: by up to 5 minutes
                     "-datasource.queryStep=0s"],
                    capture_output=True, text=True)
                log.append(f"--- {path.name} {_rfc3339(begin)}\n{replay.stderr}")
                if replay.returncode != 0 or "dropping" in replay.stderr:  # a lost write would score as silence
                    raise RuntimeError(f"vmalert replay of {path} failed: {replay.stderr[-2000:]}")
                if backend == "victoriametrics":
                    requests.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
        (workdir / "vmalert-replay.log").write_text("".join(log))
        firing = _alerts(url, fleet.timestamps[0], end, _alert_timing(rule_files))
    return Run(backend, firing, loaded - began, time.monotonic() - loaded, samples)


def _without_annotations(rule_file: dict[str, Any]) -> dict[str, Any]:
    """vmalert's replay cannot run the annotations' `query` templates; annotations do not decide firing."""
    for group in rule_file["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return rule_file


def _one_rule_files(rule_files: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each rule as a rule file of its own: a group of one rule, with its group's interval; a rule
    after every rule recording what it reads (files come in name order: failslow reads peers')."""
    singles = []
    for rule_file in rule_files:
        for group in rule_file["groups"]:
            for n, rule in enumerate(group["rules"]):
                single = {k: v for k, v in group.items() if k != "rules"}
                singles.append({"groups": [{**single, "name": f"{group['name']}-{n:02d}", "rules": [rule]}]})
    done: list[dict[str, Any]] = []
    while singles:  # stable: the first rule none of whose inputs is still to be recorded
        pending = {r["groups"][0]["rules"][0].get("record") for r in singles}
        ready = next((r for r in singles if not any(
            name and name != r["groups"][0]["rules"][0].get("record") and re.search(rf"\b{re.escape(name)}\b",
                                                                               r["groups"][0]["rules"][0]["expr"])
            for name in pending)), singles[0])
        singles.remove(ready)
        done.append(ready)
    yield from done


# Points per replay range query. Prometheus' cost per step grows with the series the whole range
# touches (each job restart starts a new workload series), so a range of 10,000 steps (83 h) took
# more than 10 minutes for the fail-slow peer median; 1,000 steps (8.3 h) keep it linear. A live
# evaluation touches only the lookback window's series.
REPLAY_POINTS = {"prometheus": 1000, "victoriametrics": 10000}


def _spans(rule_file: dict[str, Any], start: float, end: float) -> list[tuple[float, float]]:
    """The replay's time spans for a one-rule file: the whole range in one replay, except for a
    recording rule that reads its own past (the Xid episode start): a replay answers a whole
    span from one range query, in which the rule's own output does not exist yet, so such a
    rule is replayed one evaluation at a time."""
    group = rule_file["groups"][0]
    rule = group["rules"][0]
    if "record" not in rule or rule["record"] not in rule["expr"]:
        return [(start, end)]
    step = seconds(group["interval"], "interval")
    first = start - start % step + (step if start % step else 0)  # vmalert aligns evaluations to the interval
    return [(t, t + step) for t in np.arange(first, end, step)]


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _alerts(url: str, start: float, end: float, timing: dict[str, tuple[float, float]]) -> list[Firing]:
    """Alert episodes from the ALERTS series the replay wrote back.

    vmalert 1.79's replay writes an alert with `for:` as pending while its expression holds
    but never turns it to firing (seen on both backends). So `for:` is applied here, as
    Prometheus does: an episode is a run of consecutive evaluations (its group's interval
    apart) where the alert is pending or firing, and it fires from the run's start + `for`
    if the run lasts that long.
    """
    runs: dict[tuple[tuple[str, str], ...], set[float]] = {}
    chunk = 300_000  # seconds of ALERTS per query: 10,000 samples at 30 s
    at = start - 60  # VictoriaMetrics' range (t - d, t] leaves out a sample at its very start
    while at < end:
        # The samples as written (a range vector), not query_range: a range query repeats a
        # series' last sample for the lookback delta (Prometheus: 5 minutes), and the replay
        # writes no staleness marker when an alert ends, so every episode would last 5 minutes
        # longer and short ones would outlast their `for:`.
        reply = requests.get(f"{url}/api/v1/query", timeout=600, params={
            "query": f"ALERTS[{chunk:.0f}s]", "time": min(end, at + chunk)})
        reply.raise_for_status()
        for result in reply.json()["data"]["result"]:
            key = tuple(sorted((k, v) for k, v in result["metric"].items() if k not in ("__name__", "alertstate")))
            runs.setdefault(key, set()).update(float(v[0]) for v in result["values"])
        at += chunk
    episodes = []
    for key, stamps in runs.items():
        labels = dict(key)
        hold, interval = timing.get(labels.get("alertname", ""), (0.0, 30.0))
        times = sorted(stamps)
        first = times[0]
        for previous, current in zip(times, [*times[1:], None], strict=True):
            if current is None or current - previous > 1.5 * interval:
                if previous - first >= hold:
                    episodes.append(Firing(labels.get("alertname", "?"), labels, first + hold, previous))
                first = current if current is not None else first
    return episodes


def _alert_timing(rule_files: Iterable[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Alert name -> (its `for:`, its group's interval) in seconds."""
    timing = {}
    for rule_file in rule_files:
        for group in rule_file["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    timing[rule["alert"]] = (seconds(rule.get("for", 0), "for"), seconds(group["interval"], "interval"))
    return timing
