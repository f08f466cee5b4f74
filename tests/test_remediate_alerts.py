"""Alertmanager's webhook payload, parsed with validation: bad bodies are refused with a reason."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpunode_remediate import alerts
from tests.remediation import alert_json, notification, rfc3339
from tests.test_parsers_property import SETTINGS


def test_a_real_shaped_notification_parses() -> None:
    body = notification(alert_json("GpuXidHardwareFault", "gpu003", xid="79", action="RESTART_BM", gpu="3"),
                        alert_json("GpuNvLinkDegraded", "gpu004", status="resolved", ends=1_700_000_600.5))
    parsed = alerts.parse(body)
    first, second = parsed.alerts
    assert (first.name, first.status, first.labels["xid"], first.starts_at, first.ends_at) == (
        "GpuXidHardwareFault", "firing", "79", 1_700_000_000.0, None)
    assert second.status == "resolved" and second.ends_at == pytest.approx(1_700_000_600.5)


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-11-27T10:00:00Z", 1795773600.0),
    ("2026-11-27T10:00:00.123456789Z", 1795773600.123456789),
    ("2026-11-27T11:30:00+01:30", 1795773600.0),
    ("0001-01-01T00:00:00Z", None),
])
def test_times_as_go_writes_them(text: str, seconds: float | None) -> None:
    assert alerts.parse_time(text, "t") == (pytest.approx(seconds) if seconds else None)


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[]", "want a JSON object"),
    (json.dumps({"version": "3", "status": "firing", "alerts": []}).encode(), "version"),
    (json.dumps({"version": "4", "status": "firing", "alerts": {}}).encode(), "alerts: want a list"),
    (json.dumps({"version": "4", "status": "odd", "alerts": []}).encode(), "status"),
    (notification({**alert_json("A", "n"), "fingerprint": "../../etc"}), "fingerprint"),
    (notification({**alert_json("A", "n"), "labels": {"bad name": "x"}}), "no label name"),
    (notification({**alert_json("A", "n"), "labels": {"a": 1}}), "want a string"),
    (notification({**alert_json("A", "n"), "startsAt": "yesterday"}), "RFC 3339"),
    (notification({**alert_json("A", "n"), "startsAt": "2026-13-01T00:00:00Z"}), "no such time"),
    (notification({**alert_json("A", "n"), "startsAt": "0001-01-01T00:00:00Z"}), "must have started"),
    (notification({**alert_json("A", "n"), "status": "maybe"}), "firing or resolved"),
    (b"[" * 100_000, "not JSON"),
    (b" " * (alerts.MAX_BODY + 1), "over the limit"),
])
def test_bad_bodies_are_refused_with_the_reason(body: bytes, reason: str) -> None:
    with pytest.raises(alerts.PayloadError, match=reason):
        alerts.parse(body)


@SETTINGS
@given(st.binary(max_size=2000))
def test_any_bytes_parse_or_are_refused(body: bytes) -> None:
    with contextlib.suppress(alerts.PayloadError):
        alerts.parse(body)


_text = st.text(max_size=30)
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
                     max_leaves=20)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["status", "labels", "fingerprint", "startsAt", "endsAt", "annotations"]),
                       _json))
def test_any_alert_object_parses_or_is_refused(fields: dict) -> None:
    body = notification({**alert_json("A", "n"), **fields})
    try:
        parsed = alerts.parse(body)
    except alerts.PayloadError:
        return
    assert all(isinstance(v, str) for v in parsed.alerts[0].labels.values())


@SETTINGS
@given(st.floats(min_value=0, max_value=4e9))
def test_times_round_trip(t: float) -> None:
    assert alerts.parse_time(rfc3339(t), "t") == pytest.approx(t, abs=1e-6)
