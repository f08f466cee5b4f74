"""Load a simulated fleet into a real backend and replay the rule pack over the whole range.

Two backends, each a real server from Debian's packages:
- prometheus: the series written by remote write in time order (fleet/remote_write.py), an
  out-of-order window open for the replay's writes;
- victoriametrics: the same.
On both, vmalert's replay mode steps through the range at each group's interval, asks the
backend's own query engine (PromQL in Prometheus, MetricsQL in VictoriaMetrics) for every
rule, honours `for:`, and writes recording rules and ALERTS back through remote write, so
later rules read earlier ones. The rules are the pack's target for the backend (vmalert 1.79
rejects keep_firing_for, which is therefore not measured). Each rule's replay is checked against
its range (fleet/replay_check.py) and replayed again where it lost evaluations.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml

from fleet import remote_write, replay_check
from fleet.simulate import Fleet
from gpunode_common.http import free_port  # the server binds it a moment later: _ours tells if another did
from gpunode_exporter.nvmlsim.scenario import seconds
from gpunode_report.source import rfc3339
from gpunode_rulepack import load_spec, render

BACKENDS = ("prometheus", "victoriametrics")
PARALLEL_REPLAYS = 2  # one per CPU of the machines it runs on
WRITE_SLICE = 1800.0  # seconds of every series per remote-write pass (the head's window is an hour)
PARALLEL_WRITES = 2
REPLAY_RETRIES = 2  # replays of a rule's lost evaluations before the run fails (fleet/replay_check.py)
TOOLS = {"prometheus": ("prometheus", "promtool"), "victoriametrics": ("victoria-metrics",), "vmalert": ("vmalert",)}


@dataclass(frozen=True)
class Firing:
    alertname: str
    labels: dict[str, str]
    start: float  # unix seconds of the first firing evaluation of an episode
    end: float  # of the last


def missing_tools() -> list[str]:
    return [tool for tools in TOOLS.values() for tool in tools if shutil.which(tool) is None]


def _remote_write(fleet: Fleet, url: str, nodes_per_pass: int | None = None, spill: Path | None = None) -> int:
    """The fleet into a running backend by remote write, in time order: WRITE_SLICE of every
    series per pass, since Prometheus' head takes no sample an hour older than the newest it
    holds. With nodes_per_pass, the fleet is simulated that many nodes at a time, each group kept
    in a file under `spill` until written (every series at once is ~3 GB at 63 nodes x 14 days,
    twice while stacked): the writes are the same, in the same order, so Prometheus takes them
    into its head in order, not into its out-of-order head, as node after node would go."""
    millis = np.round(fleet.timestamps * 1000)
    width = max(1, int(WRITE_SLICE // fleet.s.step))
    session = requests.Session()
    if nodes_per_pass is None:
        series = list(fleet.series())
        labels = [remote_write.labels_bytes([("__name__", s.name), *s.labels]) for s in series]
        values = np.vstack([s.values for s in series])
        for first in range(0, millis.size, width):  # a pass only after the last: each series in order
            part = slice(first, first + width)
            remote_write.send(session, f"{url}/api/v1/write",
                              remote_write.encode(labels, values[:, part], millis[part]), PARALLEL_WRITES)
        return int((~np.isnan(values)).sum())
    if spill is None or nodes_per_pass < 1:
        raise ValueError("nodes_per_pass needs a spill directory and at least 1 node")
    spill.mkdir(parents=True, exist_ok=True)
    labels, groups, samples = [], [], 0
    for n in range(0, fleet.s.nodes, nodes_per_pass):
        series = list(fleet.series(range(n, min(n + nodes_per_pass, fleet.s.nodes))))  # node 0: the cluster's too
        labels += [remote_write.labels_bytes([("__name__", s.name), *s.labels]) for s in series]
        samples += sum(int((~np.isnan(s.values)).sum()) for s in series)
        path = spill / f"nodes-{n:05d}.f8"
        with path.open("wb") as out:  # pass after pass, each pass's rows one after the other
            for first in range(0, millis.size, width):
                out.write(np.vstack([s.values[first:first + width] for s in series]).astype("<f8").tobytes())
        groups.append((path, len(series)))
        del series
    for first in range(0, millis.size, width):
        size = min(first + width, millis.size) - first
        rows = []
        for path, count in groups:
            with path.open("rb") as f:
                f.seek(count * first * 8)
                rows.append(np.fromfile(f, "<f8", count * size).reshape(count, size))
        remote_write.send(session, f"{url}/api/v1/write",
                          remote_write.encode(labels, np.vstack(rows), millis[first:first + size]), PARALLEL_WRITES)
    shutil.rmtree(spill)
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


def _ours(backend: str, url: str, data: Path) -> None:
    """The server answering at url is the one started on data: another run's server on the same
    port (ours then failed to bind) would answer ready, and the run would score its data."""
    if backend == "prometheus":
        flags = requests.get(f"{url}/api/v1/status/flags", timeout=10).json()["data"]
        serving = flags.get("storage.tsdb.path", "")
    else:
        found = re.search(r'^-storageDataPath="(.*)"$', requests.get(f"{url}/flags", timeout=10).text, re.M)
        serving = found.group(1) if found else ""
    if Path(serving).resolve() != data.resolve():
        raise RuntimeError(f"{url} serves {serving or 'an unknown path'}, not this run's {data}: "
                           "another server holds the port")


@contextlib.contextmanager
def _server(argv: list[str], ready: str, log: Path, check: Callable[[], None]) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(ready, proc)
            check()
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
    retried: list[str] = field(default_factory=list)  # replays of lost evaluations (fleet/replay_check.py)


@contextlib.contextmanager
def _loaded(backend: str, fleet: Fleet, workdir: Path, port: int | None,
            nodes_per_pass: int | None) -> Iterator[tuple[str, int]]:
    """A new server of backend on workdir, the fleet loaded: (its URL, the samples written)."""
    port = port or free_port()
    shutil.rmtree(workdir, ignore_errors=True)  # a stale data directory would add its series twice
    workdir.mkdir(parents=True)
    url = f"http://127.0.0.1:{port}"
    if backend == "prometheus":
        data = workdir / "prometheus-data"
        config = workdir / "prometheus.yml"
        # Recording rules and ALERTS arrive by remote write with past timestamps: accept them.
        window = int(fleet.s.duration // 3600 + 48)
        config.write_text("global: {scrape_interval: 30s}\n"
                          f"storage: {{tsdb: {{out_of_order_time_window: {window}h}}}}\n")
        server = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                  f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                  # A live Prometheus marks a series stale at the first scrape or evaluation that lacks it;
                  # the series loaded here and the replay's recordings carry no staleness marker, so with
                  # the default 5 minutes a node that left, a job that ended, a recording that stopped
                  # would read on as if present for 5 minutes, and each rule reading another's recording
                  # adds 5 more. One minute (two 30 s evaluations) ends them about as a live server does.
                  "--storage.tsdb.retention.time=10y", "--query.lookback-delta=1m",
                  # as -search.maxQueryDuration below: a replay range query over days of 60+ nodes
                  # (the fail-slow peer median) passed the default 2 minutes on a busy machine
                  "--query.timeout=10m"]
        ready = f"{url}/-/ready"
    else:
        data = workdir / "vm-data"
        server = ["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
                  "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s",
                  # one replay write holds up to 1000 series x 10,000 points: more than the default 32 MB
                  "-maxInsertRequestSize=1GB",
                  # a replay range query of a 3-hour quantile_over_time per node (GpuNodeSlowingDown) took > 30 s
                  "-search.maxQueryDuration=600s"]
        ready = f"{url}/health"
    with _server(server, ready, workdir / f"{backend}.log", lambda: _ours(backend, url, data)):
        samples = _remote_write(fleet, url, nodes_per_pass, workdir / "spill")
        searchable(backend, url)
        yield url, samples


def searchable(backend: str, url: str) -> None:
    """What was written to the server at url, found by the next query: VictoriaMetrics holds new
    samples in memory for a second or so before a search sees them; Prometheus' head, at once."""
    if backend == "victoriametrics":
        requests.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()


@contextlib.contextmanager
def serve(backend: str, fleet: Fleet, workdir: Path, port: int | None = None,
          nodes_per_pass: int | None = None) -> Iterator[str]:
    """A server of backend (BACKENDS) with the fleet loaded, no rules replayed: its URL, while it
    serves. Its data, log and config go to workdir, emptied first; it listens on port, by default
    a free one. nodes_per_pass: simulate that many nodes at a time (_remote_write), for fleets
    too large to hold at once; the server gets the same writes in the same order either way."""
    with _loaded(backend, fleet, workdir, port, nodes_per_pass) as (url, _samples):
        yield url


def run(backend: str, fleet: Fleet, workdir: Path, port: int | None = None, spec_path: Path | None = None,
        then: Callable[[str], None] | None = None) -> Run:
    """Load the fleet into backend, replay the rule pack, return the alert episodes. The server
    listens on port, by default a free one, so that runs side by side do not meet. `then` is
    called with the server's URL after the replay, while it still serves (the report)."""
    spec = load_spec(spec_path)
    # Each backend's own target: the Prometheus one holds the PromQL forms (changes(), the newest
    # workload by sample count, whose timestamp() form costs ~25x in Prometheus' range queries).
    target = "prometheus" if backend == "prometheus" else "vmalert"
    rule_files = [_replayable(yaml.safe_load(text)) for text in render(spec, target).values()]
    began = time.monotonic()
    with _loaded(backend, fleet, workdir, port, None) as (url, samples):
        loaded = time.monotonic()
        write_url = url  # vmalert appends /api/v1/write
        rules = workdir / "rules"
        rules.mkdir(exist_ok=True)
        end = fleet.timestamps[-1] + fleet.s.step
        # One rule per replay, each replay's output flushed before a rule that reads it starts: a
        # rule then reads every earlier rule's complete output. (With all rules in one replay,
        # VictoriaMetrics had not yet made new recordings searchable when the next rule of the
        # group asked, even 3 s later, and the fail-slow ratios came out empty.) Rules that do
        # not read each other replay side by side, one per CPU.
        singles = list(_one_rule_files(rule_files))
        log: dict[int, list[str]] = {}
        retried: list[str] = []

        def vmalert(n: int, path: Path, spans: list[tuple[float, float]]) -> None:
            points = HELD_ALERT_POINTS if _held(singles[n]["groups"][0]["rules"][0]) else REPLAY_POINTS[backend]
            for begin, until in spans:
                done = subprocess.run(
                    ["vmalert", f"-rule={path}", f"-datasource.url={url}", f"-remoteWrite.url={write_url}",
                     f"-replay.timeFrom={rfc3339(begin)}", f"-replay.timeTo={rfc3339(until)}",
                     f"-replay.maxDatapointsPerQuery={points}", "-replay.rulesDelay=0s",
                     "-replay.disableProgressBar",
                     "-remoteWrite.flushInterval=100ms", "-datasource.lookback=0s", "-loggerLevel=WARN",
                     # the rule's interval as the range query's step: the default (5m) evaluated every
                     # rule on a 5-minute grid, which delayed each for: by up to 5 minutes
                     "-datasource.queryStep=0s"],
                    capture_output=True, text=True)
                log.setdefault(n, []).append(f"--- {path.name} {rfc3339(begin)}\n{done.stderr}")
                if done.returncode != 0 or "dropping" in done.stderr:  # a lost write would score as silence
                    raise RuntimeError(f"vmalert replay of {path} failed: {done.stderr[-2000:]}")
                searchable(backend, url)

        def replay(n: int) -> None:
            path = rules / f"rule-{n:03d}.yml"
            path.write_text(yaml.safe_dump(singles[n], sort_keys=False))
            vmalert(n, path, _spans(singles[n], fleet.timestamps[0], end))
            # What the range asked for, written? (A range query that came back empty wrote nothing
            # and logged nothing: VictoriaMetrics once lost the first 83 hours of a recording.)
            group = singles[n]["groups"][0]
            rule, step = group["rules"][0], seconds(group["interval"], "interval")
            name = f"{rule.get('record') or rule['alert']} ({path.name})"

            def again(gaps: list[replay_check.Gap]) -> None:
                vmalert(n, path, [span for gap in gaps for span in _gap_spans(singles[n], gap)])

            def report(line: str) -> None:
                retried.append(line)
                log.setdefault(n, []).append(f"--- {path.name} check\n{line}\n")
                print(f"{backend}: {line}", file=sys.stderr, flush=True)

            def read() -> replay_check.Written:
                return replay_check.read_written(url, replay_check.selector(rule), fleet.timestamps[0], end, step)

            replay_check.ensure(name, read, lambda t: replay_check.results(url, rule["expr"], t, step), again,
                                REPLAY_RETRIES, report)

        try:
            _in_order(_inputs(singles), replay, PARALLEL_REPLAYS)
        finally:  # also when a replay failed: its log shows what vmalert said
            (workdir / "vmalert-replay.log").write_text("".join(line for n in sorted(log) for line in log[n]))
        firing = _alerts(url, fleet.timestamps[0], end, _alert_timing(rule_files))
        if then is not None:
            then(url)
    return Run(backend, firing, loaded - began, time.monotonic() - loaded, samples, retried)


def _replayable(rule_file: dict[str, Any]) -> dict[str, Any]:
    """What vmalert's replay runs: no annotations (it cannot run their `query` templates, and they
    do not decide firing), no keep_firing_for (vmalert 1.79 rejects it, so it is not measured)."""
    for group in rule_file["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            rule.pop("keep_firing_for", None)
    return rule_file


def _one_rule_files(rule_files: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each rule as a rule file of its own: a group of one rule, with its group's interval; a rule
    after every rule recording what it reads (files come in name order: failslow reads peers')."""
    singles = []
    for rule_file in rule_files:
        for group in rule_file["groups"]:
            for n, rule in enumerate(group["rules"]):
                single = {k: v for k, v in group.items() if k not in ("rules", "concurrency")}
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


def _inputs(singles: list[dict[str, Any]]) -> list[set[int]]:
    """For each one-rule file, the earlier ones that record what it reads."""
    rules = [single["groups"][0]["rules"][0] for single in singles]
    return [{j for j, earlier in enumerate(rules[:i])
             if earlier.get("record") and re.search(rf"\b{re.escape(earlier['record'])}\b", rule["expr"])}
            for i, rule in enumerate(rules)]


def _in_order(inputs: list[set[int]], work: Callable[[int], None], workers: int) -> None:
    """work(i) for every i, at most `workers` at once, each after work on all of inputs[i] has
    returned; the lowest ready i first. The first exception stops the run."""
    done: set[int] = set()
    running: dict[Future[None], int] = {}
    with ThreadPoolExecutor(workers) as pool:
        while len(done) < len(inputs):
            for i, needs in enumerate(inputs):
                if len(running) < workers and i not in done and i not in running.values() and needs <= done:
                    running[pool.submit(work, i)] = i
            if not running:
                raise RuntimeError(f"rules wait for each other: {sorted(set(range(len(inputs))) - done)}")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()
                done.add(running.pop(future))


# Points per replay range query. Prometheus' cost per step grows with the series the whole range
# touches (each job restart starts a new workload series): 8 h 20 min of the fail-slow peer
# median took 18.7 s as one query of 1,000 steps, 6-7 s in queries of 250 and 4.9 s of 120,
# while a day of one node's NFS ratio took 11 % longer in queries of 240 than of 1,000. A live
# evaluation touches only the lookback window's series.
REPLAY_POINTS = {"prometheus": 240, "victoriametrics": 10000}


def _spans(rule_file: dict[str, Any], start: float, end: float) -> list[tuple[float, float]]:
    """The replay's time spans for a one-rule file: the whole range in one replay, except for a
    recording rule that reads its own past (the Xid episode start): a replay answers a whole
    span from one range query, in which the rule's own output does not exist yet, so such a
    rule is replayed one evaluation at a time. An alert with `for:` (_held) runs in spans that
    share no evaluation."""
    group = rule_file["groups"][0]
    rule = group["rules"][0]
    step = seconds(group["interval"], "interval")
    if _held(rule):
        return _disjoint(replay_check.evaluations(start, end, step))
    if "record" not in rule or rule["record"] not in rule["expr"]:
        return [(start, end)]
    first = start - start % step + (step if start % step else 0)  # vmalert aligns evaluations to the interval
    return [(t, t + step) for t in np.arange(first, end, step)]


def _gap_spans(rule_file: dict[str, Any], gap: replay_check.Gap) -> list[tuple[float, float]]:
    """The replay spans that write a gap's evaluations again and no other (a range query includes
    both ends, so a span ends a second after its last evaluation): the gap in one span, or one
    span per evaluation for a rule that reads its own past (as _spans), or spans that share no
    evaluation for an alert with `for:`."""
    rule = rule_file["groups"][0]["rules"][0]
    if _held(rule):
        return _disjoint(gap.times())
    if "record" in rule and rule["record"] in rule["expr"]:
        return [(float(t), float(t) + 1) for t in gap.times()]
    return [(gap.first, gap.last + 1)]


# Evaluations per vmalert run of an alert with `for:`, all in one range query. vmalert's replay
# splits a longer range into queries whose ends overlap, so it writes each boundary's evaluation
# twice, and the two ALERTS_FOR_STATE samples (the alert's start) differ. When the second arrives
# in a later write, Prometheus refuses it ("duplicate sample for timestamp") and vmalert drops that
# whole write: seen on a busy machine, where the next query took longer than a write's flush.
HELD_ALERT_POINTS = 1440


def _held(rule: dict[str, Any]) -> bool:
    """An alert with `for:`, for which vmalert writes ALERTS_FOR_STATE."""
    return "alert" in rule and seconds(rule.get("for", 0), "for") > 0


def _disjoint(times: np.ndarray) -> list[tuple[float, float]]:
    """Spans of at most HELD_ALERT_POINTS of these evaluations each, no two sharing one."""
    return [(float(chunk[0]), float(chunk[-1]) + 1)
            for chunk in (times[i:i + HELD_ALERT_POINTS] for i in range(0, len(times), HELD_ALERT_POINTS))]


def _alerts(url: str, start: float, end: float, timing: dict[str, tuple[float, float]]) -> list[Firing]:
    """Alert episodes from the ALERTS series the replay wrote back.

    vmalert 1.79's replay writes an alert with `for:` as pending, then firing, but starts it
    afresh at each run's first evaluation (_held). So `for:` is applied here, as Prometheus
    does: an episode is a run of consecutive evaluations (its group's interval apart) where
    the alert is pending or firing, and it fires from the run's start + `for` if the run
    lasts that long.
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
