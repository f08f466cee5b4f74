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
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exporter import __version__
from exporter.webconfig import WebConfig

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # set by serve()
    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, in the request's own thread, so a slow or
        # silent client cannot hold up accept().
        if self.ssl_context is not None:
            request.settimeout(_HANDSHAKE_TIMEOUT)
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as err:
                log.debug("TLS handshake with %s failed: %s", client_address, err)
                return
            request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def make_handler(render: Callable[[], Iterator[bytes]], web: WebConfig, telemetry_path: str,
                 max_requests: int = 40) -> type:
    # node_exporter's --web.max-requests: scrapes beyond this many at once get 503.
    slots = threading.BoundedSemaphore(max_requests) if max_requests > 0 else None
    landing = (
        "<html><head><title>gpunode-exporter</title></head><body>"
        f"<h1>gpunode-exporter {html.escape(__version__)}</h1>"
        f'<p><a href="{html.escape(telemetry_path)}">Metrics</a></p></body></html>\n'
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        server_version = f"gpunode-exporter/{__version__}"
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds an idle keep-alive connection may hold its thread
        # The response goes out in several writes (headers, then the body family by family);
        # with Nagle's algorithm a keep-alive client's delayed ACK held the body ~40 ms.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _authorized(self) -> bool:
            if not web.users:
                return True
            header = self.headers.get("Authorization", "")
            scheme, _, encoded = header.partition(" ")
            if scheme.lower() != "basic":
                return False
            try:
                user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            return web.authorized(user, password)

        def _send(self, code: int, body: bytes | list[bytes], content_type: str,
                  extra: dict[str, str]) -> None:
            parts = body if isinstance(body, list) else [body]
            self.send_response(code)
            for name, value in {**web.headers, **extra}.items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(sum(len(p) for p in parts)))
            self.end_headers()
            if self.command != "HEAD":
                for part in parts:
                    if part:
                        self.wfile.write(part)

        def do_GET(self) -> None:
            if not self._authorized():
                self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                           {"WWW-Authenticate": 'Basic realm="gpunode-exporter"'})
                return
            path = self.path.split("?", 1)[0]
            if path == telemetry_path:
                if slots is not None and not slots.acquire(blocking=False):
                    self._send(503, b"Too many concurrent scrapes\n", "text/plain; charset=utf-8", {})
                    return
                try:
                    self._metrics()
                finally:
                    if slots is not None:
                        slots.release()
            elif path == "/":
                self._send(200, landing, "text/html; charset=utf-8", {})
            else:
                self._send(404, b"Not Found\n", "text/plain; charset=utf-8", {})

        def _metrics(self) -> None:
            # Family by family: the whole text is never joined in memory.
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                gz = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: gzip framing
                parts = [gz.compress(chunk) for chunk in render()]
                parts.append(gz.flush())
                self._send(200, parts, CONTENT_TYPE, {"Content-Encoding": "gzip"})
            else:
                self._send(200, list(render()), CONTENT_TYPE, {})

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
