"""Alertmanager's webhook payload (version 4), parsed with validation: nothing in it is trusted.

A body that is not JSON, not this schema, or too large raises PayloadError with the reason;
the service answers 400 with it and changes nothing.
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass

MAX_BODY = 16 << 20  # bytes: a notification of 10,000 alerts is ~12 MiB
MAX_LABEL = 4096  # characters in one label name or value
_FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# RFC 3339 as Go writes it: up to nanoseconds, Z or an offset; ASCII digits only.
_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
                   r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))")


class PayloadError(ValueError):
    """Why a notification was refused: one line, sent back in the 400 response."""


@dataclass(frozen=True)
class Alert:
    fingerprint: str
    status: str  # firing | resolved
    labels: dict[str, str]
    starts_at: float  # Unix seconds
    ends_at: float | None  # None: Go's zero time (a firing alert without an end)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


@dataclass(frozen=True)
class Notification:
    receiver: str
    status: str
    alerts: tuple[Alert, ...]


def got(value: object) -> str:
    """What a JSON value was, for an error: `got 4 (a number)`, `got null`, `got a list`."""
    if value is None:
        return "got null (or nothing)"
    if isinstance(value, bool):
        return f"got {str(value).lower()} (a boolean)"
    if isinstance(value, int | float):
        return f"got {str(value)[:20]} (a number)"
    if isinstance(value, str):
        return f"got {json.dumps(value[:40])} (a string)"
    return "got a list" if isinstance(value, list) else "got an object"


def parse_time(value: object, where: str) -> float | None:
    """RFC 3339 to Unix seconds; Go's zero time (year 1) to None."""
    match = _TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise PayloadError(f"{where}: want an RFC 3339 time, {got(value)}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if year <= 1:
        return None
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        raise PayloadError(f"{where}: no such time {value!r}")
    fraction = float(match.group(7) or 0)
    offset = 0
    if match.group(9):
        offset = (int(match.group(10)) * 60 + int(match.group(11))) * 60 * (1 if match.group(9) == "+" else -1)
    return calendar.timegm((year, month, day, hour, minute, second)) + fraction - offset


def _labels(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: want an object of strings, {got(value)}")
    for name, text in value.items():
        if not _LABEL_NAME.fullmatch(name) or len(name) > MAX_LABEL:
            raise PayloadError(f"{where}: {name[:40]!r} is no label name")
        if not isinstance(text, str):
            raise PayloadError(f"{where}.{name}: want a string, {got(text)}")
        if len(text) > MAX_LABEL:
            raise PayloadError(f"{where}.{name}: want at most {MAX_LABEL} characters, got {len(text)}")
    return value


def _alert(item: object, where: str) -> Alert:
    if not isinstance(item, dict):
        raise PayloadError(f"{where}: want an object, {got(item)}")
    status = item.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"{where}.status: want firing or resolved, {got(status)}")
    fingerprint, labels, starts, ends = alert_fields(item, where)
    return Alert(fingerprint, status, labels, starts, ends)


def alert_fields(item: dict, where: str) -> tuple[str, dict[str, str], float, float | None]:
    """Fingerprint, labels, start and end of an alert as Alertmanager writes it (webhook and API v2)."""
    fingerprint = item.get("fingerprint")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
        raise PayloadError(f"{where}.fingerprint: want Alertmanager's hex fingerprint, {got(fingerprint)}")
    labels = _labels(item.get("labels"), f"{where}.labels")
    if item.get("annotations") is not None:
        _labels(item["annotations"], f"{where}.annotations")
    starts = parse_time(item.get("startsAt"), f"{where}.startsAt")
    if starts is None:
        raise PayloadError(f"{where}.startsAt: an alert must have started")
    ends = parse_time(item.get("endsAt"), f"{where}.endsAt")
    return fingerprint, labels, starts, ends


def parse(body: bytes) -> Notification:
    if len(body) > MAX_BODY:
        raise PayloadError(f"body of {len(body)} bytes is over the limit of {MAX_BODY}")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise PayloadError(f"not JSON: {str(err)[:80]}") from None
    if not isinstance(data, dict):
        raise PayloadError(f"want a JSON object (Alertmanager's webhook payload), {got(data)}")
    if data.get("version") != "4":
        raise PayloadError(f"version: want \"4\" (Alertmanager's webhook payload), {got(data.get('version'))}")
    status = data.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"status: want firing or resolved, {got(status)}")
    receiver = data.get("receiver", "")
    if not isinstance(receiver, str):
        raise PayloadError(f"receiver: want a string, {got(receiver)}")
    items = data.get("alerts")
    if not isinstance(items, list):
        raise PayloadError(f"alerts: want a list, {got(items)}")
    return Notification(receiver, status, tuple(_alert(item, f"alerts[{n}]") for n, item in enumerate(items)))
