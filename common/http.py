"""HTTP(S) server: landing page at /, metrics at the telemetry path."""

from __future__ import annotations

import base64
import binascii
import html
import logging
import socket
import ssl
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpunode_common import __version__
from gpunode_common.webconfig import WebConfig

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HANDSHAKE_TIMEOUT = 10.0


def parse_listen_address(value: str) -> tuple[str, int]:
    """node_exporter style: ':9100', '0.0.0.0:9100', '[::1]:9100', 'localhost:9100'."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r}: want [host]:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: put an IPv6 host in brackets")
    return host, int(port)


# The last ports free_port handed out, each still bound (not listening) so that no one else gets it.
_RESERVED: deque[socket.socket] = deque()
_RESERVED_MAX = 64
_reserve_lock = threading.Lock()


def free_port() -> int:
    """A loopback port for a server that the demo, the fleet harness, a benchmark or a test starts
    a moment later. Released at once, the port could go to anyone else's bind(0) or outgoing
    connection first: two demos side by side had one Prometheus fail with "address already in use".
    So it stays bound, with SO_REUSEADDR and never listening, until 64 more ports are handed out:
    the kernel then gives it to no bind(0) and no connect(), while a server that sets SO_REUSEADDR
    (Go's net.Listen, Python's HTTPServer, Slurm's daemons) binds and listens on it."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))  # without SO_REUSEADDR: a port no other socket holds
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # now a server may share it
        port: int = s.getsockname()[1]
    except OSError:
        s.close()
        raise
    with _reserve_lock:
        _RESERVED.append(s)
        while len(_RESERVED) > _RESERVED_MAX:
            _RESERVED.popleft().close()
    return port


def _somaxconn() -> int:
    """The kernel's cap on a listen backlog: Go servers ask for it, and so do we (socketserver's
    default of 5 drops SYNs from a burst of scrapes)."""
    try:
        with open("/proc/sys/net/core/somaxconn", "rb") as f:
            return max(socket.SOMAXCONN, int(f.read().strip() or 0))
    except (OSError, ValueError):
        return 4096


def accepts_gzip(header: str) -> bool:
    """RFC 9110 12.5.3: gzip (else *) listed with a q-value above 0; "gzip;q=0" refuses it."""
    weights: dict[str, float] = {}
    for item in header.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights.setdefault(coding.lower(), q)
    q = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return q > 0


def basic_authorized(header: str, web: WebConfig) -> bool:
    """An Authorization header against the web config's basic-auth users; with none, anyone."""
    if not web.users:
        return True
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return web.authorized(user, password)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = _somaxconn()
    # set by serve()
    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, in the request's own thread, so a slow or
        # silent client cannot hold up accept().
        if self.ssl_context is not None:
            request.settimeout(_HANDSHAKE_TIMEOUT)
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except OSError as err:  # ssl.SSLError is one
                log.debug("TLS handshake with %s failed: %s", client_address, err)
                return
            request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


_BATCH_BYTES = 1 << 16


def _body(render: Callable[[], Iterator[bytes]], gzipped: bool) -> list[bytes]:
    """Family by family, joined into pieces of ~64 KiB: the whole text is never joined in memory,
    and a piece costs one compress call (a call per family cost more than the compression)."""
    gz = zlib.compressobj(1, zlib.DEFLATED, 31) if gzipped else None  # wbits 31: gzip framing
    parts: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for chunk in render():
        batch.append(chunk)
        size += len(chunk)
        if size >= _BATCH_BYTES:
            parts.append(gz.compress(b"".join(batch)) if gz else b"".join(batch))
            batch, size = [], 0
    if gz is None:
        parts.append(b"".join(batch))
    else:
        parts += [gz.compress(b"".join(batch)), gz.flush()]
    return parts


class SharedBody:
    """Scrapes that arrive while a body is being rendered get that body rather than render
    their own: a burst of scrapes (HA Prometheus pairs, a retry storm) costs about one
    render, and the thread accepting connections is not starved of the GIL meanwhile."""

    def __init__(self, render: Callable[[], Iterator[bytes]]) -> None:
        self._render = render
        self._lock = threading.Lock()
        self._pending: dict[bool, Future[list[bytes]]] = {}

    def get(self, gzipped: bool) -> list[bytes]:
        with self._lock:
            future = self._pending.get(gzipped)
            leader = future is None
            if future is None:
                future = self._pending[gzipped] = Future()
        if leader:
            try:
                future.set_result(_body(self._render, gzipped))
            except BaseException as err:
                future.set_exception(err)
            finally:
                with self._lock:
                    del self._pending[gzipped]
        return future.result()


def make_handler(render: Callable[[], Iterator[bytes]], web: WebConfig, telemetry_path: str,
                 max_requests: int = 40) -> type:
    # node_exporter's --web.max-requests: scrapes beyond this many at once get 503.
    slots = threading.BoundedSemaphore(max_requests) if max_requests > 0 else None
    shared = SharedBody(render)
    landing = (
        "<html><head><title>gpunode-exporter</title></head><body>"
        f"<h1>gpunode-exporter {html.escape(__version__)}</h1>"
        f'<p><a href="{html.escape(telemetry_path)}">Metrics</a></p></body></html>\n'
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds an idle keep-alive connection may hold its thread
        # The response goes out in several writes (headers, then the body family by family);
        # with Nagle's algorithm a keep-alive client's delayed ACK held the body ~40 ms.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def version_string(self) -> str:
            return "gpunode-exporter"  # no versions for a scanner to match against

        def parse_request(self) -> bool:
            if len(self.raw_requestline.split()) == 2:  # "GET /": HTTP/0.9, no headers, no auth
                self.command, self.requestline = None, str(self.raw_requestline[:80], "latin-1").rstrip()
                self.request_version = "HTTP/1.0"  # the error goes out with a status line
                self.close_connection = True
                self.send_error(400, "HTTP/0.9 is not served")
                return False
            return super().parse_request()

        def _authorized(self) -> bool:
            return basic_authorized(self.headers.get("Authorization", ""), web)

        def _send(self, code: int, body: bytes | list[bytes], content_type: str,
                  extra: dict[str, str]) -> None:
            parts = body if isinstance(body, list) else [body]
            self.send_response(code)
            for name, value in {**web.headers, **extra}.items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            length = sum(len(p) for p in parts)
            self.send_header("Content-Length", str(length))
            if self.command == "HEAD":
                parts = []
            elif length <= _BATCH_BYTES:  # with the headers in one write: one segment, not several
                self._headers_buffer.extend([b"\r\n", *parts])
                self.flush_headers()
                return
            self.end_headers()
            for part in parts:
                if part:
                    self.wfile.write(part)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            # The limit comes before authentication: a flood of wrong passwords must not cost a
            # bcrypt check each beyond --web.max-requests at once.
            limited = path == telemetry_path and slots is not None
            if limited and not slots.acquire(blocking=False):
                self._send(503, b"Too many concurrent scrapes\n", "text/plain; charset=utf-8", {})
                return
            try:
                if not self._authorized():
                    self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                               {"WWW-Authenticate": 'Basic realm="gpunode-exporter"'})
                elif path == telemetry_path:
                    self._metrics()
                elif path == "/":
                    self._send(200, landing, "text/html; charset=utf-8", {})
                else:
                    self._send(404, b"Not Found\n", "text/plain; charset=utf-8", {})
            finally:
                if limited:
                    slots.release()

        def _metrics(self) -> None:
            if accepts_gzip(self.headers.get("Accept-Encoding", "")):
                self._send(200, shared.get(True), CONTENT_TYPE, {"Content-Encoding": "gzip"})
            else:
                self._send(200, shared.get(False), CONTENT_TYPE, {})

        do_HEAD = do_GET  # noqa: N815

    return Handler


def make_server(address: str, handler: type, web: WebConfig) -> ThreadingHTTPServer:
    host, port = parse_listen_address(address)
    server_cls = type("Server", (_Server,), {})
    if host == "" and socket.has_dualstack_ipv6():
        server_cls.address_family = socket.AF_INET6
        host = "::"
    elif ":" in host:
        server_cls.address_family = socket.AF_INET6
    server = server_cls((host or "0.0.0.0", port), handler, bind_and_activate=False)
    if server_cls.address_family == socket.AF_INET6 and host == "::":
        server.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    server.ssl_context = web.ssl_context
    try:
        server.server_bind()
        server.server_activate()
    except OSError:
        server.server_close()
        raise
    return server
