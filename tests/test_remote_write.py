"""Remote write without protobuf or snappy libraries (fleet/remote_write.py): what the benchmarks
and the fleet harness feed Prometheus and VictoriaMetrics with. Decoded here by an independent
reader of the wire format; the servers' own acceptance is tested by the harness tests."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fleet import remote_write as rw


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int, object]]:
    """(field, wire type, value): varint -> int, 64-bit -> float, length-delimited -> bytes."""
    out, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 1:
            value, at = struct.unpack("<d", data[at:at + 8])[0], at + 8
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((field, wire, value))
    return out


def _unsnappy(data: bytes) -> bytes:
    size, at = _varint(data, 0)
    assert data[at] == 0xFC  # one literal, 4-byte length
    length = int.from_bytes(data[at + 1:at + 5], "little") + 1
    body = data[at + 5:at + 5 + length]
    assert len(body) == size == length and at + 5 + length == len(data)
    return body


def _decode(request: bytes) -> list[tuple[dict[str, str], list[tuple[float, int]]]]:
    series = []
    for field, _, ts in _fields(request):
        assert field == 1
        labels, samples = {}, []
        for f, _, item in _fields(ts):  # type: ignore[arg-type]
            parts = {k: v for k, _, v in _fields(item)}  # type: ignore[arg-type]
            if f == 1:
                labels[parts[1].decode()] = parts[2].decode()  # type: ignore[union-attr]
            else:
                samples.append((parts[1], parts[2]))
        series.append((labels, samples))
    return series


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_varint_round_trips(n: int) -> None:
    assert _varint(rw.varint(n), 0) == (n, len(rw.varint(n)))


@given(st.lists(st.floats(allow_nan=True), min_size=1, max_size=30),
       st.integers(min_value=1 << 35, max_value=(1 << 42) - 10**6),
       st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=12), max_size=4))
def test_series_decode_to_what_was_encoded(values: list[float], start: int, extra: dict[str, str]) -> None:
    millis = start + 15_000 * np.arange(len(values))
    labels = {"__name__": "m", **extra}
    row = np.array(values, dtype=float)
    encoded = list(rw.encode([rw.labels_bytes(labels.items())], row[None, :], millis))
    kept = [(v, int(t)) for v, t in zip(values, millis, strict=True) if v == v]
    if not kept:  # every sample NaN: no series at all
        assert encoded == []
        return
    [(got_labels, got)] = _decode(_unsnappy(rw.snappy_literal(b"".join(encoded))))
    assert got_labels == labels
    assert list(got_labels) == sorted(labels)  # the receivers want labels sorted by name
    assert got == kept


def test_batches_split_between_series_only() -> None:
    items = [bytes([i]) * 100 for i in range(10)]
    batches = list(rw.batches(items, limit=250))
    assert [len(b) for b in batches] == [300, 300, 300, 100]
    assert b"".join(batches) == b"".join(items)


def test_timestamps_outside_six_byte_varints_are_refused() -> None:
    for bad in (0, 1 << 42):
        try:
            rw.timestamps_bytes(np.array([bad]))
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")
