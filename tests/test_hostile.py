"""A hostile node: input a real node produces sooner or later, one case at a time.

Each case once took the exporter down or blanked its metrics: a corrupt state file, a
planted symlink, a process name that is not UTF-8, numbers no kernel prints, a poisoned
kernel record, a burst of scrapes, HTTP details. The whole node at once is in
tests/test_hostile_node.py.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest
import requests

from gpunode_common.exposition import Renderer
from gpunode_common.http import accepts_gzip, make_handler, make_server
from gpunode_common.webconfig import WebConfig, _dummy_hash
from gpunode_exporter.collector.base import MetricSpec
from gpunode_exporter.gpu_processes import ProcessTracker
from gpunode_exporter.nvml import Session
from gpunode_exporter.xid import state as statefile
from gpunode_exporter.xid import tracker as trackermod
from gpunode_exporter.xid.gpus import GpuDirectory
from gpunode_exporter.xid.tracker import XidTracker
from tests.helpers import free_port, parse_exposition

ROOT = Path(__file__).parent.parent
BOOT = "5e1f0d6c-boot"
XID79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid=2001, name=python, GPU has fallen off the bus."
GOOD = {"version": 1, "boot_id": BOOT, "source": "kmsg", "kmsg_seq": 3, "records_lost": 0,
        "gpus": {"0000:1b:00.0": {"gpu": "0", "uuid": "GPU-1"}},
        "xids": [{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": 2, "last": 1.5e9}], "recovery": {}}


def _with(**changes: object) -> str:
    return json.dumps({**GOOD, **changes})


# --- the Xid state file --------------------------------------------------------------

CORRUPT = {
    "400-digit last": _with(xids=[{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": 2, "last": int("9" * 400)}]),
    "400-digit count": _with(xids=[{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": int("9" * 400), "last": 1}]),
    "deep nesting": '{"version": 1, "gpus": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "lone surrogate in a uuid": _with(gpus={"0000:1b:00.0": {"gpu": "0", "uuid": "GPU-\ud800"}}),
    "NaN time": _with(xids=[{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": 2, "last": float("nan")}]),
    "wrong types": _with(gpus=[1, 2], xids={"a": 1}),
    "count as a string": _with(xids=[{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": "2", "last": 1}]),
    "not JSON": "{\"version\": 1,",
    "not UTF-8": b"\xff\xfe{}".decode("latin-1"),
}


@pytest.mark.parametrize("text", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_state_is_moved_aside_and_counting_starts_again(tmp_path: Path, text: str) -> None:
    path = tmp_path / statefile.FILE_NAME
    path.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode("utf-8", "surrogatepass"))
    state, problem = statefile.load(path, BOOT)
    assert state == statefile.State(BOOT) and problem is not None and "moved to" in problem
    assert not path.exists() and (tmp_path / (statefile.FILE_NAME + ".corrupt")).exists()


def test_a_good_state_still_loads(tmp_path: Path) -> None:
    path = tmp_path / statefile.FILE_NAME
    path.write_text(json.dumps(GOOD))
    state, problem = statefile.load(path, BOOT)
    assert problem is None and state.counts[("0000:1b:00.0", 79)].value == 2


@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "directory", "huge file"])
def test_only_a_regular_file_of_sane_size_is_read(tmp_path: Path, kind: str) -> None:
    path = tmp_path / statefile.FILE_NAME
    if kind == "fifo":
        os.mkfifo(path)  # opened blocking, this hung the start
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge file":
        path.write_bytes(b" " * (statefile.MAX_BYTES + 1))
    else:
        path.symlink_to("/dev/zero")  # read whole, this was a MemoryError
    started = time.monotonic()
    state, problem = statefile.load(path, BOOT)
    assert time.monotonic() - started < 5
    assert state == statefile.State(BOOT) and problem is not None
    assert not os.path.lexists(path)  # moved aside: the next save writes a fresh file


def test_a_planted_temporary_symlink_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / f".{statefile.FILE_NAME}.tmp").symlink_to(victim)
    statefile.save(state_dir / statefile.FILE_NAME, statefile.State(BOOT))
    assert victim.read_text() == "precious\n"
    saved = state_dir / statefile.FILE_NAME
    assert not saved.is_symlink() and json.loads(saved.read_text())["boot_id"] == BOOT
    assert saved.stat().st_mode & 0o777 == 0o600


def _tracker(tmp_path: Path, kmsg_lines: list[str]) -> XidTracker:
    procfs = tmp_path / "proc"
    (procfs / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (procfs / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("".join(f"{line}\n" for line in kmsg_lines))
    session = Session()
    return XidTracker(kmsg, tmp_path / "state", True, procfs, GpuDirectory(session, tmp_path, procfs), session)


def test_a_dangling_lock_symlink_does_not_create_its_target(tmp_path: Path) -> None:
    target = tmp_path / "created-anywhere"
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "xid-state.lock").symlink_to(target)
    tracker = _tracker(tmp_path, [])
    try:
        assert not os.path.lexists(target)
        assert tracker.state_errors == {} and tracker._lock_file is not None  # held: counts are saved
    finally:
        tracker.close()


# --- the Xid reader -------------------------------------------------------------------

def _wait(condition, seconds: float = 10) -> None:
    # The last answer decides: asking once more to assert would race with what the answer
    # released (a scrape's slot is given back just after its response went out).
    deadline = time.monotonic() + seconds
    while not (met := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert met


POISON = {
    "400-digit timestamp": f"4,1,{'9' * 400},-;{XID79}",
    "5,000-digit code": f"4,1,1000,-;NVRM: Xid (PCI:0000:1b:00): {'7' * 5000}, GPU has fallen off the bus.",
    "Arabic-Indic digits as the code": "4,1,1000,-;NVRM: Xid (PCI:0000:1b:00): \u0667\u0669, pid=1, name=x, y",
    "plus sign in the sequence": f"4,+1,1000,-;{XID79}",
}


@pytest.mark.parametrize("poison", POISON.values(), ids=POISON.keys())
def test_a_poisoned_record_costs_that_record_alone(tmp_path: Path, poison: str) -> None:
    tracker = _tracker(tmp_path, [f"4,0,500,-;{XID79}", poison, f"4,2,2000,-;{XID79}"])
    tracker.start()
    try:
        _wait(lambda: tracker.snapshot().records_read == 3)
        snap = tracker.snapshot()
        assert [(xid, count) for _, _, xid, count, _ in snap.counts] == [(79, 2)]
        assert snap.records_malformed == 1 and snap.reader_error is None and tracker._thread.is_alive()
    finally:
        tracker.close()


def test_a_failed_reader_restarts_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trackermod, "READER_BACKOFF", 0.3)
    tracker = _tracker(tmp_path, [f"4,0,500,-;{XID79}", f"4,1,600,-;{XID79}"])
    real_identity, fail = tracker._identity, threading.Event()
    fail.set()

    def identity(bus: str):
        if fail.is_set():
            raise RuntimeError("injected")
        return real_identity(bus)

    tracker._identity = identity  # type: ignore[method-assign]
    tracker.start()
    try:
        _wait(lambda: tracker.snapshot().reader_failures >= 1)
        assert tracker.snapshot().reader_error == "RuntimeError: injected" and tracker.snapshot().source is None
        fail.clear()
        _wait(lambda: tracker.snapshot().reader_error is None and tracker.snapshot().counts)
        with (tmp_path / "kmsg").open("a") as f:
            f.write(f"4,2,700,-;{XID79}\n")
        _wait(lambda: tracker.snapshot().records_read == 3)
        snap = tracker.snapshot()
        assert [(xid, count) for _, _, xid, count, _ in snap.counts] == [(79, 3)]  # none lost, none twice
        assert snap.records_lost == 0
    finally:
        tracker.close()


# --- /proc and the renderer -----------------------------------------------------------

def test_a_process_named_in_bytes_that_are_not_utf8_costs_nothing() -> None:
    # Any user may name a process so (prctl(PR_SET_NAME)); on a real /proc this failed the collector.
    code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'\\xff\\xfe) (x'), 0, 0, 0); "
            "sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ok\n"
        assert b"\xff\xfe" in Path(f"/proc/{child.pid}/stat").read_bytes()
        tracker = ProcessTracker(Path("/proc"))
        tracker.scan()
        assert child.pid in tracker._procs  # read, not skipped
    finally:
        child.kill()
        child.wait()


def test_a_label_value_that_is_not_utf8_costs_that_value_alone() -> None:
    spec = MetricSpec("gpunode_test_total", "counter", "A test.", ("device",))
    family = spec.family()
    family.add(("mlx5_\udcff",), 1)  # os.listdir's name for the byte 0xff
    family.add(("GPU-\ud800",), 2)  # JSON's lone surrogate
    family.add(("mlx5_0",), 3)
    text = Renderer().render([family]).decode("utf-8")
    assert parse_exposition(text)["gpunode_test_total"] == {
        (("device", "mlx5_\ufffd"),): 1, (("device", "GPU-\ufffd"),): 2, (("device", "mlx5_0"),): 3}


# --- HTTP -----------------------------------------------------------------------------

class _Server:
    def __init__(self, web: WebConfig, render=lambda: iter([b"up 1\n"]), max_requests: int = 40) -> None:
        self.server = make_server(f"127.0.0.1:{free_port()}", make_handler(render, web, "/metrics", max_requests), web)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_listen_backlog_is_the_kernels_cap() -> None:
    server = _Server(WebConfig())
    try:
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert server.server.request_queue_size >= max(somaxconn, 128)
    finally:
        server.close()


def test_a_burst_of_200_scrapes_is_answered() -> None:
    # Answered 200 or 503 (past --web.max-requests), none refused or timed out. Speed: benchmarks/burst.py.
    server = _Server(WebConfig())
    try:
        with ThreadPoolExecutor(200) as pool:
            codes = list(pool.map(lambda _: requests.get(server.url + "/metrics", timeout=10).status_code, range(200)))
        assert set(codes) <= {200, 503} and codes.count(200) >= 40
    finally:
        server.close()


def test_scrapes_during_a_render_share_its_body() -> None:
    renders, started, release = [], threading.Event(), threading.Event()

    def slow_render():
        renders.append(1)
        started.set()
        release.wait(10)
        yield f"up {len(renders)}\n".encode()

    server = _Server(WebConfig(), slow_render)
    try:
        with ThreadPoolExecutor(20) as pool:
            first = pool.submit(requests.get, server.url + "/metrics", timeout=10)
            assert started.wait(5)
            rest = [pool.submit(requests.get, server.url + "/metrics", timeout=10) for _ in range(19)]
            time.sleep(0.5)  # all of them arrived while the first render runs
            release.set()
            bodies = [first.result().text] + [r.result().text for r in rest]
        assert bodies == ["up 1\n"] * 20 and len(renders) == 1
        assert requests.get(server.url + "/metrics", timeout=10).text == "up 2\n"  # a new scrape renders anew
    finally:
        release.set()
        server.close()


def test_the_limit_comes_before_authentication() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_render():
        entered.set()
        release.wait(10)
        yield b"up 1\n"

    web = WebConfig(users={"prom": bcrypt.hashpw(b"secret", bcrypt.gensalt(4))})
    server = _Server(web, slow_render, max_requests=1)
    try:
        first = threading.Thread(target=lambda: requests.get(server.url + "/metrics", auth=("prom", "secret"),
                                                             timeout=10))
        first.start()
        assert entered.wait(5)
        # A wrong password while the slot is taken costs no bcrypt: it is turned away first.
        assert requests.get(server.url + "/metrics", auth=("prom", "wrong"), timeout=10).status_code == 503
        release.set()
        first.join(10)
        # The slot comes back just after the first answer went out: then a wrong password gets 401.
        _wait(lambda: requests.get(server.url + "/metrics", auth=("prom", "wrong"), timeout=10).status_code == 401)
    finally:
        release.set()
        server.close()


def test_unknown_users_cost_what_known_ones_do() -> None:
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(6))
    web = WebConfig(users={"prom": hashed})
    assert not web.authorized("nobody", "x")
    assert _dummy_hash(6)[:7] == hashed[:7] == b"$2b$06$"  # the dummy is checked at the users' cost


@pytest.mark.parametrize(("header", "gzipped"), [
    ("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False), ("identity", False),
    ("*", True), ("*;q=0", False), ("*, gzip;q=0", False), ("deflate, GZIP;q=0.5", True), ("", False),
])
def test_accept_encoding_q_values_are_honoured(header: str, gzipped: bool) -> None:
    assert accepts_gzip(header) is gzipped


def test_http_details() -> None:
    server = _Server(WebConfig())
    try:
        response = requests.get(server.url + "/metrics", headers={"Accept-Encoding": "gzip;q=0"}, timeout=10)
        assert "Content-Encoding" not in response.headers and response.text == "up 1\n"
        response = requests.get(server.url + "/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10, stream=True)
        assert gzip.decompress(response.raw.read()) == b"up 1\n"
        assert response.headers["Server"] == "gpunode-exporter"  # no Python version for a scanner
        host, port = server.server.server_address[:2]
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"GET /metrics\r\n")  # HTTP/0.9: no headers, so no auth and no status line
            reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 400 ") and b"up 1" not in reply
    finally:
        server.close()


def test_dump_exits_when_a_source_blocks(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    (procfs / "self").mkdir(parents=True)
    os.mkfifo(procfs / "self" / "mountstats")  # reads as a hung NFS read would: forever
    config = tmp_path / "config.yaml"
    config.write_text("collector_timeout_seconds: 1\n")
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", "--collector.disable-defaults",
                          "--collector.nfs",
                          "--path.procfs", str(procfs), "--config.file", str(config)],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 0, out.stderr
    assert 'gpunode_scrape_collector_success{collector="nfs"} 0' in out.stdout
    assert "did not finish" in out.stderr

