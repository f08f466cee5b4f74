"""HTTP(S): Alertmanager posts to /alerts; /metrics, /-/healthy, /-/ready. TLS and basic auth as
the exporter's --web.config.file; a bearer token file as Alertmanager's http_config sends one."""

from __future__ import annotations

import hmac
import logging
import time
from http.server import BaseHTTPRequestHandler

from gpunode_common.exposition import Renderer
from gpunode_common.http import CONTENT_TYPE, basic_authorized
from gpunode_common.webconfig import WebConfig
from gpunode_remediate import alerts, metrics
from gpunode_remediate.engine import Engine

log = logging.getLogger("gpunode-remediate")
WEBHOOK_PATH = "/alerts"


def make_handler(engine: Engine, web: WebConfig, token: bytes | None) -> type:
    renderer = Renderer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def version_string(self) -> str:
            return "gpunode-remediate"

        def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for name, value in {**web.headers, **(extra or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _authorized(self) -> bool:
            header = self.headers.get("Authorization", "")
            if token is not None:
                scheme, _, given = header.partition(" ")
                if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token):
                    return True
                if not web.users:
                    return False
            return basic_authorized(header, web)

        def _refuse(self) -> None:
            engine.count_webhook_error("unauthorized")
            self._send(401, b"Unauthorized\n", extra={"WWW-Authenticate": 'Basic realm="gpunode-remediate"'})

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/-/healthy", "/-/ready"):
                self._send(200, b"OK\n")
            elif not self._authorized():
                self._refuse()
            elif path == "/metrics":
                self._send(200, renderer.render(metrics.families(engine)), CONTENT_TYPE)
            elif path == "/":
                self._send(200, b"gpunode-remediate: POST Alertmanager webhooks to /alerts; /metrics\n")
            else:
                self._send(404, b"Not Found\n")

        do_HEAD = do_GET  # noqa: N815

        def do_POST(self) -> None:
            received = time.time()
            if self.path.split("?", 1)[0] != WEBHOOK_PATH:
                self._send(404, b"Not Found\n")
                return
            if not self._authorized():
                self.close_connection = True
                self._refuse()
                return
            length = self.headers.get("Content-Length", "")
            if not (length.isascii() and length.isdigit()):
                self.close_connection = True
                self._bad("invalid", "Content-Length required")
                return
            if int(length) > alerts.MAX_BODY:
                self.close_connection = True  # the body is never read
                self._bad("too_large", f"body of {length} bytes is over the limit of {alerts.MAX_BODY}")
                return
            body = self.rfile.read(int(length))
            try:
                notification = alerts.parse(body)
            except alerts.PayloadError as err:
                self._bad("invalid", str(err))
                return
            try:
                changed = engine.receive(notification, received)
            except Exception as err:  # the state file: Alertmanager retries on 5xx
                engine.count_webhook_error("storage")
                log.exception("cannot store a notification")
                self._send(500, f"cannot store the notification: {err}\n".encode())
                return
            self._send(200, f"{len(notification.alerts)} alerts, {changed} changed\n".encode())

        def _bad(self, kind: str, reason: str) -> None:
            engine.count_webhook_error(kind)
            log.warning("refused a notification from %s: %s", self.address_string(), reason)
            self._send(400, f"{reason}\n".encode())

    return Handler
