"""Prometheus and VictoriaMetrics + vmalert behind one interface: start, load and stop the rules,
poll each group's evaluations, read their own counters, take backfilled history, so that one
measurement loop serves both."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    die_with_parent,
    free_port,
    wait_ready,
)
from prometheus_client.parser import text_string_to_metric_families

from .generator import Generator
from .pack import PROMETHEUS, PROMTOOL, RULES_COPY, VICTORIA, VMALERT, copy_rules, file_key
from .synthetic import write_backfill

STARTUP_TIMEOUT = 120.0  # seconds until an engine answers its health check
STARTUP_POLL = 0.5


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@dataclass
class Evaluations:
    """Per group: each evaluation's duration (s) seen during the measurement; per rule likewise."""

    groups: dict[str, list[float]] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)  # unix time each evaluation began
    rules: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    last_seen: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    multi: int = 0  # polls that saw more than one vmalert iteration of a group at once (mean recorded)


def record_rules(evals: Evaluations, groups: list[dict[str, Any]], record: bool,
                 ) -> Iterator[tuple[str, dict[str, Any]]]:
    """From an /api/v1/rules answer (Prometheus' or vmalert's): each group evaluated since the last
    call, after its rules' evaluation times (when recording) and errors are noted."""
    for g in groups:
        key = f"{file_key(g['file'])}/{g['name']}"
        stamp = g.get("lastEvaluation")
        if not stamp or stamp.startswith("0001-") or evals.last_seen.get(key) == stamp:
            continue
        evals.last_seen[key] = stamp
        for rule in g["rules"]:
            if rule.get("lastError"):
                evals.errors[f"{key}/{rule.get('name')}"] = rule["lastError"]
        if not record:
            continue
        evals.starts.setdefault(key, []).append(datetime.datetime.fromisoformat(stamp).timestamp())
        per_rule = evals.rules.setdefault(key, {})
        for i, rule in enumerate(g["rules"]):
            per_rule.setdefault(f"{i:02d} {rule.get('name')}", []).append(rule.get("evaluationTime", 0.0))
        yield key, g


class Backend:
    key = ""
    label = ""
    target = ""  # the pack's: rules/<target>/

    def __init__(self, tmp: Path, gen: Generator, args: argparse.Namespace) -> None:
        self.tmp, self.gen, self.args = tmp, gen, args
        self.procs: list[ServerProcess] = []
        self.evals = Evaluations()
        self.started = 0.0

    @property
    def query_url(self) -> str:
        raise NotImplementedError

    def stop_rules(self) -> None:
        raise NotImplementedError

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.query_url}/api/v1/query", params={"query": expr}, timeout=120)
        data = r.json()
        if data.get("status") != "success":
            raise BenchError(f"{self.label}: query {expr!r} failed: {data.get('error') or r.text[:300]}")
        return data["data"]["result"]

    def copy_pack(self) -> None:
        """The pack's files where the engine reads them, groups slower than --max-group-interval sped up."""
        self.rules = RULES_COPY / self.target
        self.overridden, self.rejected = copy_rules(self.target, self.rules, self.args.max_group_interval,
                                                    self.args.eval_interval)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def cpu(self) -> dict[str, float]:
        return {p.key: p.cpu_seconds() for p in self.procs}

    def memory(self) -> dict[str, dict[str, int]]:
        return {p.key: p.memory_kib() for p in self.procs}


def scrape_config(gen: Generator, args: argparse.Namespace, extra: str = "") -> str:
    """Prometheus' config; extra (its rule_files and evaluation_interval) is left out for VictoriaMetrics."""
    return (f"global:\n  scrape_interval: {args.scrape_interval}s\n  scrape_timeout: {args.scrape_interval - 1}s\n"
            f"{extra}"
            "scrape_configs:\n  - job_name: synthetic\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{gen.port}']\n")


class PrometheusBackend(Backend):
    key = "prometheus"
    label = "Prometheus"
    target = "prometheus"

    def start(self) -> None:
        self.copy_pack()
        self.config = self.tmp / "prometheus.yml"
        self.config.write_text(self._config(rules=False))
        self.data = self.tmp / "prometheus-data"
        port = free_port()
        p = ServerProcess("prometheus", f"Prometheus ({PROMETHEUS})", [
            PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=90d",
            "--web.enable-remote-write-receiver", "--web.enable-lifecycle"],
            port, self.tmp / "prometheus.log")
        self.procs.append(p)
        p.start(die_with_parent)
        wait_ready(p, f"http://127.0.0.1:{port}/-/ready", STARTUP_TIMEOUT, STARTUP_POLL)
        self.url = f"http://127.0.0.1:{port}"
        self.write_url = f"{self.url}/api/v1/write"

    def _config(self, rules: bool) -> str:
        extra = (f"  evaluation_interval: {self.args.eval_interval}s\nrule_files:\n  - {self.rules}/*.yml\n"
                 if rules else "")
        if self.args.input == "scrape":
            return scrape_config(self.gen, self.args, extra)
        return "global:\n" + (extra or "  evaluation_interval: 1h\n")

    def load_rules(self) -> None:
        self.config.write_text(self._config(rules=True))
        requests.post(f"{self.url}/-/reload", timeout=60).raise_for_status()
        self.started = time.time()
        groups = requests.get(f"{self.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        if not groups:
            raise BenchError("Prometheus loaded no rule groups on reload")

    @property
    def query_url(self) -> str:
        return self.url

    def stop_rules(self) -> None:
        self.config.write_text(self._config(rules=False))
        requests.post(f"{self.url}/-/reload", timeout=60).raise_for_status()

    def poll(self, record: bool) -> None:
        groups = requests.get(f"{self.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for key, g in record_rules(self.evals, groups, record):
            self.evals.groups.setdefault(key, []).append(g["evaluationTime"])

    def counters(self) -> dict[str, dict[str, float]]:
        m = parse_metrics(requests.get(f"{self.url}/metrics", timeout=30).text)
        out: dict[str, dict[str, float]] = {}
        for name, short in (("prometheus_rule_group_iterations_missed_total", "missed"),
                            ("prometheus_rule_group_iterations_total", "iterations"),
                            ("prometheus_rule_evaluation_failures_total", "failures")):
            for labels, value in m.get(name, []):
                file, _, group = labels["rule_group"].rpartition(";")
                out.setdefault(f"{file_key(file)}/{group}", {})[short] = value
        out["_tsdb"] = {"head_series": m["prometheus_tsdb_head_series"][0][1]}
        return out

    def backfill(self, series: dict[str, list[tuple[dict[str, str], float]]], start: float, end: float,
                 step: float) -> int:
        """OpenMetrics file -> promtool tsdb create-blocks-from openmetrics into the data directory;
        Prometheus loads new blocks within a minute."""
        om = self.tmp / "backfill.om"
        points = write_backfill(om, series, start, end, step, ms=False)
        run = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1440h",
                              str(om), str(self.data)], capture_output=True, text=True, check=False)
        om.unlink()
        if run.returncode:
            raise BenchError(f"promtool create-blocks-from openmetrics failed: {run.stderr[-1000:]}")
        return points


class VictoriaBackend(Backend):
    key = "victoriametrics"
    label = "VictoriaMetrics + vmalert"
    target = "vmalert"

    def start(self) -> None:
        self.copy_pack()
        scrape = []
        if self.args.input == "scrape":
            config = self.tmp / "vm-scrape.yml"
            config.write_text(scrape_config(self.gen, self.args).replace(
                "    honor_labels: true\n", "    honor_labels: true\n    stream_parse: true\n"))
            scrape = [f"-promscrape.config={config}", "-promscrape.maxScrapeSize=2GiB"]
        port = free_port()
        vm = ServerProcess("victoria-metrics", f"VictoriaMetrics ({VICTORIA})", [
            VICTORIA, f"-storageDataPath={self.tmp / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{port}",
            # the report counts every recorded series (over 300,000 at 1,000 reference nodes)
            *scrape, "-retentionPeriod=90d", "-search.maxUniqueTimeseries=5000000"],
            port, self.tmp / "victoria-metrics.log")
        self.procs.append(vm)
        vm.start(die_with_parent)
        self.url = f"http://127.0.0.1:{port}"
        self.write_url = f"{self.url}/api/v1/write"
        wait_ready(vm, f"{self.url}/health", STARTUP_TIMEOUT, STARTUP_POLL)

    def load_rules(self) -> None:
        requests.get(f"{self.url}/internal/force_flush", timeout=60)  # the input searchable before the first rule
        alert_port = free_port()
        va = ServerProcess("vmalert", f"vmalert ({VMALERT})", [
            VMALERT, f"-rule={self.rules}/*.yml", f"-datasource.url={self.url}", f"-remoteWrite.url={self.url}",
            f"-notifier.url=http://127.0.0.1:{self.gen.port}", f"-evaluationInterval={self.args.eval_interval}s",
            f"-httpListenAddr=127.0.0.1:{alert_port}"], alert_port, self.tmp / "vmalert.log")
        self.procs.append(va)
        va.start(die_with_parent)
        self.started = time.time()
        self.alert_url = f"http://127.0.0.1:{alert_port}"
        wait_ready(va, f"{self.alert_url}/health", STARTUP_TIMEOUT, STARTUP_POLL)
        self._prev: dict[str, tuple[float, float]] = {}

    @property
    def query_url(self) -> str:
        return self.url

    def stop_rules(self) -> None:
        self.procs[-1].stop()  # vmalert

    def _vmalert_metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        return parse_metrics(requests.get(f"{self.alert_url}/metrics", timeout=30).text)

    def poll(self, record: bool) -> None:
        m = self._vmalert_metrics()
        sums = {f"{file_key(lb['file'])}/{lb['group']}": v
                for lb, v in m.get("vmalert_iteration_duration_seconds_sum", [])}
        for labels, count in m.get("vmalert_iteration_duration_seconds_count", []):
            key = f"{file_key(labels['file'])}/{labels['group']}"
            prev = self._prev.get(key)
            self._prev[key] = (count, sums.get(key, 0.0))
            if not record or prev is None or count <= prev[0]:
                continue
            n = count - prev[0]
            self.evals.multi += n > 1
            self.evals.groups.setdefault(key, []).append((sums.get(key, 0.0) - prev[1]) / n)
        # Per rule: vmalert's /api/v1/rules (its group duration comes from the summary above).
        groups = requests.get(f"{self.alert_url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for _ in record_rules(self.evals, groups, record):
            pass

    def counters(self) -> dict[str, dict[str, float]]:
        m = self._vmalert_metrics()
        out: dict[str, dict[str, float]] = {}
        for name, short in (("vmalert_iteration_missed_total", "missed"), ("vmalert_iteration_total", "iterations")):
            for labels, value in m.get(name, []):
                out.setdefault(f"{file_key(labels['file'])}/{labels['group']}", {})[short] = value
        for labels, value in m.get("vmalert_iteration_duration_seconds", []):
            key = f"{file_key(labels['file'])}/{labels['group']}"
            out.setdefault(key, {})[f"summary_q{labels['quantile']}"] = value
        with contextlib.suppress(requests.RequestException, ValueError, KeyError):
            n = requests.get(f"{self.url}/api/v1/series/count", timeout=60).json()["data"][0]
            out["_tsdb"] = {"series": n}
        return out

    def backfill(self, series: dict[str, list[tuple[dict[str, str], float]]], start: float, end: float,
                 step: float) -> int:
        """/api/v1/import/prometheus (text with timestamps), then the rollup cache reset."""
        path = self.tmp / "backfill.prom"
        points = write_backfill(path, series, start, end, step, ms=True)
        with path.open("rb") as f:
            r = requests.post(f"{self.url}/api/v1/import/prometheus", data=f, timeout=600)
        path.unlink()
        if not r.ok:
            raise BenchError(f"VictoriaMetrics import failed: {r.status_code} {r.text[:300]}")
        requests.get(f"{self.url}/internal/force_flush", timeout=60)
        requests.get(f"{self.url}/internal/resetRollupResultCache", timeout=60)
        return points

