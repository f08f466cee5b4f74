"""Shared by the remediation service's tests: Alertmanager-shaped alerts and notifications."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from gpunode_remediate.alerts import Alert

_ZERO = "0001-01-01T00:00:00Z"


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def alert_json(alertname: str, node: str, status: str = "firing", starts: float = 1_700_000_000.0,
               ends: float | None = None, **labels: str) -> dict[str, Any]:
    labels = {"alertname": alertname, "instance": f"{node}:19835", "severity": "critical", **labels}
    fingerprint = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    return {"status": status, "labels": labels, "annotations": {"summary": f"{alertname} on {node}"},
            "startsAt": rfc3339(starts), "endsAt": rfc3339(ends) if ends else _ZERO,
            "generatorURL": "http://prometheus/graph", "fingerprint": fingerprint}


def notification(*alerts: dict[str, Any], receiver: str = "gpunode-remediate") -> bytes:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return json.dumps({"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": status,
                       "receiver": receiver, "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                       "externalURL": "http://alertmanager", "alerts": list(alerts)}).encode()


def alert(alertname: str, node: str, starts: float = 100.0, fingerprint: str | None = None, **labels: str) -> Alert:
    labels = {"alertname": alertname, "instance": f"{node}:19835", **labels}
    return Alert(fingerprint or hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16],
                 "firing", labels, starts, None)
