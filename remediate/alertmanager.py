"""Alertmanager's own list of its alerts (`GET /api/v2/alerts`), for what webhooks lose: a resolved
notification never sent (Alertmanager restarted with its state lost, a route edited, send_resolved
off) or a notification sent while the service was down. Parsed with validation, as a webhook is: a
bad item costs that item alone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from gpunode_remediate.alerts import MAX_BODY, Alert, PayloadError, alert_fields

STATES = ("active", "suppressed", "unprocessed")  # suppressed: silenced or inhibited


class UnreachableError(RuntimeError):
    """Alertmanager did not answer with its list: one line saying why."""


@dataclass(frozen=True)
class Listed:
    alert: Alert  # as a firing alert of a webhook
    state: str  # active, suppressed or unprocessed
    receivers: frozenset[str]


def parse(body: bytes) -> tuple[list[Listed], int]:
    """The alerts of a `GET /api/v2/alerts` answer, and how many items were refused."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise UnreachableError(f"not JSON: {str(err)[:80]}") from None
    if not isinstance(data, list):
        raise UnreachableError("want a JSON list of alerts (Alertmanager's API v2)")
    listed, refused = [], 0
    for n, item in enumerate(data):
        try:
            if not isinstance(item, dict):
                raise PayloadError(f"[{n}]: want an object")
            status = item.get("status")
            state = status.get("state") if isinstance(status, dict) else None
            if state not in STATES:
                raise PayloadError(f"[{n}].status.state: want one of {', '.join(STATES)}")
            receivers = item.get("receivers")
            if not isinstance(receivers, list) or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                                          for r in receivers):
                raise PayloadError(f"[{n}].receivers: want a list of {{name}}")
            fingerprint, labels, starts, _ends = alert_fields(item, f"[{n}]")
            listed.append(Listed(Alert(fingerprint, "firing", labels, starts, None), state,
                                 frozenset(r["name"] for r in receivers)))
        except PayloadError:
            refused += 1
    return listed, refused


def fetch(url: str, timeout: float) -> tuple[list[Listed], int]:
    """Every alert Alertmanager holds, in any state."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=timeout) as response:
            body = response.read(MAX_BODY + 1)
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise UnreachableError(f"{url}: {getattr(err, 'reason', err)}") from None
    if len(body) > MAX_BODY:
        raise UnreachableError(f"{url}: an answer over {MAX_BODY} bytes")
    return parse(body)
