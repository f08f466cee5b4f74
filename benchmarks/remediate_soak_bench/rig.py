"""The real parts of the soak and the faults put between them: the service as a process (killed with
SIGKILL and restarted on its state file), Alertmanager with the shipped routing (killed and restarted
with its state lost), a webhook proxy that loses notifications, an scontrol wrapper that logs every
call and fails or stalls some, and a sender that posts alerts as Prometheus does."""

from __future__ import annotations

import contextlib
import hashlib
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml

from demo.slurm import SlurmCluster, _tool
from gpunode_common.http import free_port

ROOT = Path(__file__).resolve().parents[2]
# Of every 1000 scheduler calls, by call number: refused at once (exit 1), stalled before reaching
# Slurm, answered by Slurm and then stalled (it took effect; the caller sees a timeout). 5 % in all.
FAIL, HANG, LATE = 25, 38, 50
DROP = 50  # of every 1000 webhook POSTs, answered 200 and never forwarded


BF_INTERVAL = 2  # Slurm's backfill pass (bf_interval, 30 s): a requeue's future StartTime starts at the next one


class SoakCluster(SlurmCluster):
    """demo/slurm.py's cluster, its backfill pass every BF_INTERVAL s rather than every 30 s: the compressed
    clock's backoff of 3-6 s would otherwise wait for the next pass (docs/remediation.md, "How a requeue
    is made")."""

    def _slurm_conf(self) -> str:
        conf = super()._slurm_conf()
        plain = "SchedulerParameters=batch_sched_delay=0"
        if plain not in conf:
            raise RuntimeError("demo/slurm.py's slurm.conf changed: the soak adds bf_interval to its "
                               "SchedulerParameters")
        return conf.replace(plain, f"{plain},bf_interval={BF_INTERVAL}")


def per_mille(salt: str, n: int) -> int:
    """A seeded draw from 0-999 for the n-th call; the scontrol wrapper computes the same in sh."""
    return int(hashlib.md5(f"{salt}:{n}".encode()).hexdigest()[:7], 16) % 1000


def read_new(path: Path, offset: int, whole_lines: bool = False) -> tuple[str, int]:
    """What a growing log gained since byte `offset` (up to its last whole line, if asked), and the
    offset to read from next."""
    size = path.stat().st_size if path.exists() else 0
    if size <= offset:
        return "", offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read(size - offset)
    if whole_lines:
        data = data[:data.rfind(b"\n") + 1]
    return data.decode(errors="replace"), offset + len(data)


def snapshot_sources(dest: Path) -> Path:
    """remediate/ and common/ (what it imports) as they are now: every restart of the service runs the
    code the run began with, whatever another engineer edits meanwhile (the service is started with
    cwd=dest)."""
    for package in ("remediate", "common"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def source_digest(tree: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for package in ("remediate", "common") for p in (tree / package).rglob("*.py")):
        digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def write_scontrol_wrapper(path: Path, real: str, calls: Path, seed: int) -> None:
    """The policy's scheduler.scontrol. Each call gets a number and a line in `calls` (time, number, fate,
    argv joined by \\x1f) before anything else; for an update (nodename=) or reboot of a node, a `before`
    line with the node as Slurm showed it just before; for a call that reached Slurm, an `end` line with its
    exit code. Job calls (requeuehold, update jobid=, release) get their fates as any other.
    setpriv --pdeathsig: the real scontrol dies with the wrapper, as it would die with the service."""
    _write_wrapper(path, real, calls, f"scontrol-{seed}", lookups="", node_before=True)


def write_squeue_wrapper(path: Path, real: str, calls: Path, seed: int) -> None:
    """The policy's scheduler.squeue, logged as the scontrol wrapper logs (its own numbers and `calls`).
    The job listing (`--states=all --Format=...`, each pass) and the one-job lookups (`--jobs=ID`: a
    job's name for jobs.select, its exclusions before a requeue) fail and stall as scontrol calls do
    (drawn by call number)."""
    _write_wrapper(path, real, calls, f"squeue-{seed}", lookups="", node_before=False)




def _write_wrapper(path: Path, real: str, calls: Path, salt: str, lookups: str, node_before: bool) -> None:
    q = shlex.quote
    spare = (f'case " $* " in *" {lookups}"*) spare=1;; *) spare=;; esac\n' if lookups else "spare=\n")
    draw = 'k=$(flock "$calls.lock" sh -c "$count" sh "$calls.k")' if lookups else "k=$n"
    before = """case "$1" in
  update) case "$2" in nodename=*) node=${2#nodename=};; *) node=;; esac;;
  reboot) eval "node=\\${$#}";;
  *) node=;;
esac
if [ -n "$node" ]; then
  seen=$(setpriv --pdeathsig KILL "$real" -o show node "$node" 2>&1 | head -n 1)
  printf '%s\\t%s\\tbefore\\t%s\\n' "$(date +%s.%N)" "$n" "$seen" >> "$calls"
fi
""" if node_before else ""
    path.write_text(f"""#!/bin/sh
calls={q(str(calls))}; real={q(real)}
count='n=$(( $(cat "$1" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$1"; echo "$n"'
n=$(flock "$calls.lock" sh -c "$count" sh "$calls.n")
{spare}fate=call
if [ -z "$spare" ]; then
  {draw}
  r=$(( 0x$(printf '%s:%s' {q(salt)} "$k" | md5sum | cut -c1-7) % 1000 ))
  if [ "$r" -lt {FAIL} ]; then fate=fail
  elif [ "$r" -lt {HANG} ]; then fate=hang
  elif [ "$r" -lt {LATE} ]; then fate=late
  fi
fi
IFS=$(printf '\\037')
printf '%s\\t%s\\t%s\\t%s\\n' "$(date +%s.%N)" "$n" "$fate" "$*" >> "$calls"
case "$fate" in
  fail) echo "$(basename "$real"): error: failure injected by the soak" >&2; exit 1;;
  hang) exec sleep 3600;;
esac
{before}setpriv --pdeathsig KILL "$real" "$@"
rc=$?
printf '%s\\t%s\\tend\\t%s\\n' "$(date +%s.%N)" "$n" "$rc" >> "$calls"
[ "$fate" = late ] && exec sleep 3600
exit "$rc"
""")
    path.chmod(0o755)


def reset_command(log: Path) -> list[str]:
    """The policy's reset_command: a `TIME NODE GPUS` line per GPU reset."""
    return ["sh", "-c", f'echo "$(date +%s.%N) $0 $1" >> {shlex.quote(str(log))}', "{node}", "{gpu}"]


def wait_until(ready: Callable[[], Any], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException, OSError):
            if ready():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


class Service:
    """gpunode-remediate serve as a process, from the snapshot `source`, on one port and state file
    for all its lives."""

    def __init__(self, base: Path, source: Path, env: dict[str, str], policy: dict[str, Any]) -> None:
        self.source, self.env = source, env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.policy = base / "policy.yml"
        self.policy.write_text(yaml.safe_dump(policy))
        self.log = base / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpunode_remediate", "serve", "--config.file",
                                          str(self.policy), "--web.listen-address", f"127.0.0.1:{self.port}"],
                                         cwd=self.source, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log)
        wait_until(lambda: self._ready(), "the service to answer", 30)

    def _ready(self) -> bool:
        if not self.up:
            raise RuntimeError(f"the service exited: {self.log.read_text()[-2000:]}")
        return requests.get(f"{self.url}/-/ready", timeout=1).ok

    def kill(self) -> None:
        if self.up:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.up:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def gauges(self) -> dict[str, float]:
        """The unlabelled samples of /metrics."""
        text = requests.get(f"{self.url}/metrics", timeout=2).text
        return {name: float(value) for name, value in
                (line.split() for line in text.splitlines() if line and line[0] != "#" and "{" not in line)}

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`gpunode-remediate ARGS --config.file POLICY`: what a person runs."""
        return subprocess.run([sys.executable, "-m", "gpunode_remediate", *args, "--config.file", str(self.policy)],
                              cwd=self.source, env=self.env, capture_output=True, text=True, timeout=60)


class Alertmanager:
    """Debian's Alertmanager with the shipped alertmanager.yml; its remediation route posts to `webhook`
    and waits 1 s rather than 10 (group_interval 1 s rather than 1 min: the soak's compressed clock)."""

    def __init__(self, base: Path, webhook: str) -> None:
        self.base = base
        config = yaml.safe_load((ROOT / "alertmanager" / "alertmanager.yml").read_text())
        receiver = next(r for r in config["receivers"] if r["name"] == "gpunode-remediate")
        receiver["webhook_configs"][0]["url"] = webhook
        route = next(r for r in config["route"]["routes"] if r["receiver"] == "gpunode-remediate")
        route.update(group_wait="1s", group_interval="1s")
        base.mkdir(parents=True, exist_ok=True)
        (base / "am.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lives = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """On a storage directory of its own each time: a restart loses every alert and notification log."""
        self.lives += 1
        with (self.base / "alertmanager.log").open("ab") as log:
            self.proc = subprocess.Popen([_tool("prometheus-alertmanager"), f"--config.file={self.base / 'am.yml'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}",
                                          f"--storage.path={self.base / f'storage-{self.lives}'}",
                                          "--cluster.listen-address="], stdout=log, stderr=log)
        wait_until(lambda: self.up and requests.get(f"{self.url}/-/ready", timeout=1).ok, "Alertmanager", 30)

    def kill(self) -> None:
        if self.up:
            self.proc.kill()
            self.proc.wait()


class DroppingProxy:
    """Between Alertmanager and the service: forwards each POST, except ~5 % (seeded, by POST number),
    answered 200 and never forwarded: Alertmanager thinks them delivered. The service down: 503, and
    Alertmanager tries again."""

    def __init__(self, seed: int) -> None:
        self.target = ""  # the service's /alerts: set once the service has its port
        self.salt = f"webhook-{seed}"
        self.posts = self.dropped = self.refused = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook-proxy", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _forward(self, body: bytes) -> tuple[int, bytes]:
        with self.lock:
            self.posts += 1
            drop = per_mille(self.salt, self.posts) < DROP
            self.dropped += drop
        if drop:
            return 200, b"dropped by the soak's proxy\n"
        request = urllib.request.Request(self.target, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError as err:
            with self.lock:
                self.refused += 1
            return 503, f"the service does not answer: {err}\n".encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                code, body = proxy._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


class PrometheusSender:
    """Alerts into Alertmanager's API as Prometheus sends them: labels, annotations, startsAt, and endsAt
    once resolved; every firing alert again every `resend` seconds, a resolved one for `keep_resolved`
    seconds after it resolved, and all of them at once when one changes. A failed POST waits for the next."""

    def __init__(self, url: str, resend: float, keep_resolved: float) -> None:
        self.url, self.resend, self.keep_resolved = url, resend, keep_resolved
        self.alerts: dict[int, dict[str, Any]] = {}  # episode -> the alert as posted
        self.resolved_at: dict[int, float] = {}
        self.lock = threading.Lock()
        self.wake, self.halt = threading.Event(), threading.Event()
        self.posts = self.failures = 0
        self.thread = threading.Thread(target=self._run, name="prometheus", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.wake.set()
        self.thread.join(timeout=15)

    def fire(self, key: int, alert: dict[str, Any]) -> None:
        with self.lock:
            self.alerts[key] = {k: alert[k] for k in ("labels", "annotations", "startsAt")}
        self.wake.set()

    def resolve(self, key: int, ends_at: str) -> None:
        with self.lock:
            if key in self.alerts and key not in self.resolved_at:
                self.alerts[key]["endsAt"] = ends_at
                self.resolved_at[key] = time.time()
        self.wake.set()

    def _batch(self) -> list[dict[str, Any]]:
        now = time.time()
        with self.lock:
            for key in [k for k, at in self.resolved_at.items() if now - at > self.keep_resolved]:
                del self.alerts[key], self.resolved_at[key]
            return list(self.alerts.values())

    def _run(self) -> None:
        while not self.halt.is_set():
            self.wake.wait(self.resend)
            self.wake.clear()
            if batch := self._batch():
                try:
                    requests.post(f"{self.url}/api/v2/alerts", json=batch, timeout=5).raise_for_status()
                    self.posts += 1
                except requests.RequestException:
                    self.failures += 1
