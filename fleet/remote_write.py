"""Prometheus remote write 1.0 requests, encoded with numpy alone (no protobuf or snappy library).

A WriteRequest is protobuf: repeated TimeSeries (field 1), each repeated Label (1: name, value)
and repeated Sample (2: double value, int64 timestamp in ms). Every sample here has the same
size (a millisecond timestamp of 2^35..2^42 is a 6-byte varint), so a series x time matrix of
samples is one numpy array. The body is snappy's block format with literals only: valid for
every decoder, no smaller than the input, and free to produce. Prometheus (with
--web.enable-remote-write-receiver) and VictoriaMetrics (/api/v1/write) both accept it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import requests

_SAMPLE = 18  # 0x12 len | 0x09 double | 0x10 varint(ts, 6 bytes)
_MIN_MS, _MAX_MS = 1 << 35, 1 << 42
HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + varint(len(payload)) + payload


def labels_bytes(labels: Iterable[tuple[str, str]]) -> bytes:
    """A TimeSeries' labels, sorted by name as the receivers expect."""
    return b"".join(_field(0x0A, _field(0x0A, k.encode()) + _field(0x12, v.encode())) for k, v in sorted(labels))


def timestamps_bytes(millis: np.ndarray) -> np.ndarray:
    """(n, 7): 0x10 and the 6-byte varint of each timestamp."""
    ms = np.asarray(millis, dtype=np.int64)
    if ms.size and (ms.min() < _MIN_MS or ms.max() >= _MAX_MS):
        raise ValueError("timestamps outside 1971-2109 do not encode to 6 bytes")
    out = np.empty((ms.size, 7), dtype=np.uint8)
    out[:, 0] = 0x10
    for i in range(6):
        out[:, 1 + i] = ((ms >> (7 * i)) & 0x7F) | (0x80 if i < 5 else 0)
    return out


def samples_bytes(values: np.ndarray, stamps: np.ndarray) -> np.ndarray:
    """(series, times) float64 values and timestamps_bytes() -> (series, times * 18) uint8."""
    values = np.ascontiguousarray(values, dtype="<f8")
    out = np.empty((*values.shape, _SAMPLE), dtype=np.uint8)
    out[..., 0], out[..., 1], out[..., 2] = 0x12, 16, 0x09
    out[..., 3:11] = values.view(np.uint8).reshape(*values.shape, 8)
    out[..., 11:] = stamps
    return out.reshape(values.shape[0], -1)


def series_bytes(labels: bytes, samples: bytes) -> bytes:
    return _field(0x0A, labels + samples)


def snappy_literal(data: bytes) -> bytes:
    """Snappy's block format: the length, then the data as one literal (tag 63: 4-byte length)."""
    if not data:
        return varint(0)
    return varint(len(data)) + bytes((0xFC,)) + (len(data) - 1).to_bytes(4, "little") + data


def batches(series: Iterable[bytes], limit: int = 8 << 20) -> Iterator[bytes]:
    """Encoded TimeSeries joined into WriteRequests of about limit bytes."""
    batch: list[bytes] = []
    size = 0
    for item in series:
        batch.append(item)
        size += len(item)
        if size >= limit:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)


def post(session: requests.Session, url: str, request: bytes) -> None:
    r = session.post(url, data=snappy_literal(request), headers=HEADERS, timeout=600)
    if not r.ok:
        raise RuntimeError(f"remote write to {url} failed: {r.status_code} {r.text[:500]}")


def send(session: requests.Session, url: str, series: Iterable[bytes], in_flight: int = 1) -> None:
    """Encoded TimeSeries to url in WriteRequests, the next encoded while up to in_flight are sent;
    returns when all have been taken. Requests in flight together may arrive in any order, so a
    series' later samples belong in a later call."""
    with ThreadPoolExecutor(in_flight) as pool:
        pending: list[Future[None]] = []
        for request in batches(series):
            while len(pending) >= in_flight:
                pending.pop(0).result()
            pending.append(pool.submit(post, session, url, request))
        for future in pending:
            future.result()


def encode(labels: Sequence[bytes], values: np.ndarray, millis: np.ndarray) -> Iterator[bytes]:
    """Encoded TimeSeries: labels[i] with values[i] (a row over millis); NaN samples left out."""
    stamps = timestamps_bytes(millis)
    rows = samples_bytes(np.where(np.isnan(values), 0.0, values), stamps)  # nan_to_num would clip inf
    gaps = np.isnan(values).any(axis=1)
    for i, label in enumerate(labels):
        if not gaps[i]:
            yield series_bytes(label, rows[i].tobytes())
            continue
        keep = ~np.isnan(values[i])
        if keep.any():
            yield series_bytes(label, rows[i].reshape(-1, _SAMPLE)[keep].tobytes())
