"""The synthetic fleet over HTTP, for --input scrape (the backend scrapes it as it would scrape
its nodes) and as vmalert's notifier, whose posts are only counted."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from typing import Any

from benchlib import free_port  # benchmarks/ is on sys.path when run as a script

from .synthetic import Fleet


class Generator:
    """The fleet over HTTP: GET /metrics, and POST anything (vmalert's notifier) is counted and dropped."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.lock = threading.Lock()
        self.renders: list[tuple[float, float, int]] = []  # (unix time, seconds to render, bytes)
        self.posts = 0
        self._cache: tuple[float, bytes] = (0.0, b"")
        gen = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = gen.body()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                gen.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def body(self) -> bytes:
        with self.lock:
            now = time.time()
            if now - self._cache[0] < 1.0:
                return self._cache[1]
            start = time.perf_counter()
            body = self.fleet.render(now)
            self.renders.append((now, time.perf_counter() - start, len(body)))
            self._cache = (now, body)
            return body

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
