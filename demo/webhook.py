"""A webhook receiver for Alertmanager: prints each alert of each notification as it arrives.

Alertmanager POSTs its webhook payload (version 4: receiver, status, alerts[] with labels,
annotations, startsAt) to the URL of the receiver; the demo's config gives each receiver
the path /<receiver name>.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Labels shown in each printed line, in this order; the rest only with --verbose.
SHOWN = ("instance", "severity", "action", "gpu", "xid", "mountpoint", "op")


@dataclass(frozen=True)
class Received:
    at: float  # time.time() when it arrived
    receiver: str
    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]

    def line(self) -> str:
        shown = " ".join(f"{k}={self.labels[k]}" for k in SHOWN if k in self.labels)
        summary = self.annotations.get("summary", "")
        return (f"{time.strftime('%H:%M:%S', time.localtime(self.at))} [{self.receiver}] "
                f"{self.status.upper():8} {self.labels.get('alertname', '?')} {shown}\n           {summary}")


class Receiver:
    def __init__(self, address: tuple[str, int], on_alert: Callable[[Received], None] = lambda _r: None) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    receiver.take(self.path.strip("/"), json.loads(body))
                    self.send_response(200)
                except (ValueError, KeyError, TypeError) as err:
                    self.send_response(400)
                    print(f"webhook: bad payload on {self.path}: {err}")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:  # quiet: the alerts are the output
                pass

        self._on_alert = on_alert
        self.server = ThreadingHTTPServer(address, Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def take(self, receiver: str, payload: dict[str, Any]) -> None:
        now = time.time()
        for alert in payload["alerts"]:
            got = Received(now, receiver, alert["status"], dict(alert["labels"]), dict(alert.get("annotations", {})))
            with self._lock:
                self.received.append(got)
            self._on_alert(got)

    def alerts(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
