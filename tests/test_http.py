"""The HTTP server as Prometheus sees it: landing page, metrics, TLS, basic auth."""

from __future__ import annotations

import gzip
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import requests

from gpunode_common.http import make_handler, make_server
from gpunode_common.webconfig import WebConfig
from tests import tlscerts
from tests.helpers import free_port, wait_for_port

ROOT = Path(__file__).parent.parent
EDGE = ROOT / "tests" / "fixtures" / "procfs" / "edge"
PASSWORD = "s3cret"


class Server:
    def __init__(self, *flags: str, host: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.state = tempfile.TemporaryDirectory()  # Xid state: not the host's /var/lib
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpunode_exporter", "--web.listen-address", f"{host}:{self.port}",
             "--path.procfs", str(EDGE), "--path.state", self.state.name, *flags],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_port(self.port, alive=lambda: self.proc.poll() is None)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


@pytest.fixture
def server_factory() -> Iterator:
    servers: list[Server] = []

    def start(*flags: str, host: str = "127.0.0.1") -> Server:
        servers.append(Server(*flags, host=host))
        return servers[-1]

    yield start
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.state.cleanup()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    tlscerts.make(directory)
    return directory


def web_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


def test_landing_metrics_gzip_404_and_clean_shutdown(server_factory) -> None:
    server = server_factory()
    base = f"http://127.0.0.1:{server.port}"
    landing = requests.get(base + "/", timeout=10)
    assert landing.status_code == 200 and 'href="/metrics"' in landing.text
    plain = requests.get(base + "/metrics", headers={"Accept-Encoding": "identity"}, timeout=10)
    assert plain.status_code == 200
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "gpunode_nfs_rpc_queue_seconds_total{" in plain.text
    assert "process_resident_memory_bytes" in plain.text
    raw = requests.get(base + "/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10, stream=True)
    assert raw.headers["Content-Encoding"] == "gzip"
    assert b"gpunode_nfs_mount_info" in gzip.decompress(raw.raw.read())
    assert requests.get(base + "/nope", timeout=10).status_code == 404
    assert server.stop() == 0


def test_custom_telemetry_path(server_factory) -> None:
    server = server_factory("--web.telemetry-path", "/custom")
    base = f"http://127.0.0.1:{server.port}"
    assert "gpunode_" in requests.get(base + "/custom", timeout=10).text
    assert requests.get(base + "/metrics", timeout=10).status_code == 404


def test_basic_auth(server_factory, tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    server = server_factory("--web.config.file", web_config(tmp_path, f"basic_auth_users:\n  prom: '{hashed}'\n"))
    url = f"http://127.0.0.1:{server.port}/metrics"
    anonymous = requests.get(url, timeout=10)
    assert anonymous.status_code == 401 and "Basic" in anonymous.headers["WWW-Authenticate"]
    assert "gpunode_" not in anonymous.text
    assert requests.get(url, auth=("prom", "wrong"), timeout=10).status_code == 401
    assert requests.get(url, auth=("nobody", PASSWORD), timeout=10).status_code == 401
    for _ in range(2):  # the second answer comes from the cache
        ok = requests.get(url, auth=("prom", PASSWORD), timeout=10)
        assert ok.status_code == 200 and "gpunode_nfs_" in ok.text


def test_tls_serves_only_over_tls(server_factory, tmp_path: Path, certs: Path) -> None:
    config = f"tls_server_config:\n  cert_file: {certs}/server.crt\n  key_file: {certs}/server.key\n"
    server = server_factory("--web.config.file", web_config(tmp_path, config))
    ok = requests.get(f"https://127.0.0.1:{server.port}/metrics", verify=str(certs / "ca.crt"), timeout=10)
    assert ok.status_code == 200 and "gpunode_nfs_" in ok.text
    try:
        plain = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
        assert "gpunode_" not in plain.text
    except requests.exceptions.ConnectionError:
        pass  # no handshake, no data
    # the server is still healthy for TLS clients afterwards
    assert requests.get(f"https://127.0.0.1:{server.port}/", verify=str(certs / "ca.crt"),
                        timeout=10).status_code == 200


def test_mutual_tls_requires_a_client_certificate(server_factory, tmp_path: Path, certs: Path) -> None:
    config = (f"tls_server_config:\n  cert_file: {certs}/server.crt\n  key_file: {certs}/server.key\n"
              f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs}/ca.crt\n")
    server = server_factory("--web.config.file", web_config(tmp_path, config))
    url = f"https://127.0.0.1:{server.port}/metrics"
    with pytest.raises(requests.exceptions.RequestException):
        requests.get(url, verify=str(certs / "ca.crt"), timeout=10)
    ok = requests.get(url, verify=str(certs / "ca.crt"), timeout=10,
                      cert=(str(certs / "client.crt"), str(certs / "client.key")))
    assert ok.status_code == 200 and "gpunode_nfs_" in ok.text


@pytest.mark.parametrize(("config", "message"), [
    ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n", "cannot load"),
    ("tls_server_config:\n  cert_file: a\n", "cert_file and key_file are both required"),
    ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "cipher_suites: not supported"),
    ("basic_auth_users:\n  prom: plaintext\n", "basic_auth_users.prom: not a bcrypt hash"),
    ("tls_config:\n  cert_file: a\n", "unknown key 'web.tls_config'"),
])
def test_bad_web_config_exits_2(tmp_path: Path, config: str, message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "--web.config.file", web_config(tmp_path, config),
                          "--web.listen-address", f"127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("address", ["9100", "127.0.0.1:notaport", "::1:9100", "127.0.0.1:70000"])
def test_bad_listen_address_exits_2(address: str) -> None:
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "--web.listen-address", address],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 2 and "--web.listen-address" in out.stderr


def test_port_in_use_is_reported() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "--web.listen-address", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in out.stderr


def test_a_free_port_stays_ours_until_our_server_binds_it() -> None:
    """Handed out, the port goes to no other bind(0) nor to a plain bind (two demos side by side once
    lost Prometheus's port so), yet the server started for it, Go's or ours, listens there."""
    port = free_port()
    others = [socket.socket() for _ in range(2000)]
    try:
        for other in others:
            other.bind(("127.0.0.1", 0))
        assert port not in {other.getsockname()[1] for other in others}
    finally:
        for other in others:
            other.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    node_exporter = subprocess.Popen(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
                                      "--collector.disable-defaults"], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, alive=lambda: node_exporter.poll() is None)
        assert "go_goroutines" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        node_exporter.terminate()
        node_exporter.wait(10)
    web = WebConfig()
    server = make_server(f"127.0.0.1:{port}", make_handler(lambda: iter([b"up 1\n"]), web, "/metrics", 1), web)
    server.server_close()


def test_scrapes_beyond_max_requests_get_503() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_render():
        entered.set()
        release.wait(10)
        yield b"up 1\n"

    web = WebConfig()
    server = make_server(f"127.0.0.1:{free_port()}", make_handler(slow_render, web, "/metrics", 1), web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    first: list[requests.Response] = []
    try:
        waiter = threading.Thread(target=lambda: first.append(requests.get(url, timeout=10)))
        waiter.start()
        assert entered.wait(5)
        assert requests.get(url, timeout=10).status_code == 503
        release.set()
        waiter.join(10)
        assert first[0].status_code == 200 and first[0].text == "up 1\n"
        # The slot is given back once the handler returns, which can be just after the client has
        # read the whole response: asked again until then, for ten seconds at most (a busy machine).
        deadline = time.monotonic() + 10.0
        while (code := requests.get(url, timeout=10).status_code) == 503 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert code == 200  # the slot was given back
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_empty_host_listens_on_ipv4_and_ipv6(server_factory) -> None:
    server = server_factory(host="")
    assert "gpunode_" in requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    if socket.has_ipv6 and socket.has_dualstack_ipv6():
        assert "gpunode_" in requests.get(f"http://[::1]:{server.port}/metrics", timeout=10).text
    assert server.stop() == 0
