"""Reading a range of series from a Prometheus-compatible query API (Prometheus, VictoriaMetrics,
Thanos, Mimir): range queries on a fixed grid, in chunks small enough that neither the server nor
this process holds a long range at once."""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

import numpy as np

from gpunode_common.config import ConfigError, seconds

# Points per series per range query: Prometheus refuses more than 11,000, and a reply's JSON of
# ~60 nodes x 2,000 points parses into ~20 MB of Python objects, freed chunk by chunk.
CHUNK_POINTS = 2000
TIMEOUT = 300.0
# Chunks asked at once: the server (its own process, on another CPU) answers the next while this
# process parses one; each is held parsed until its turn, so memory grows with this.
AHEAD = 2

Labels = tuple[tuple[str, str], ...]


class ReportError(Exception):
    """One line for the person running the report: exit 2."""


def parse_time(text: str, now: float) -> float:
    """RFC 3339 (2026-11-21T00:00:00Z), `now`, or relative to now (-7d, -36h)."""
    if text == "now":
        return now
    if text.startswith("-"):
        try:
            return now - seconds(text[1:], "time")
        except ConfigError as err:
            raise ReportError(f"{text}: want RFC 3339, now or a relative time such as -7d") from err
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"{text}: want RFC 3339, now or a relative time such as -7d") from None
    if when.tzinfo is None:
        raise ReportError(f"{text}: want a time zone (Z or +hh:mm)")
    return when.timestamp()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A sample value as the API writes it (a JSON string: "1.5", "NaN", "+Inf").
_VALUE = r"[+-]?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+|Inf|NaN)"
_ONE_VALUE = re.compile(_VALUE)
_VALUE_LINES = re.compile(rf"(?:{_VALUE}\n)*{_VALUE}")


def _number(text: object) -> float:
    if not isinstance(text, str) or not _ONE_VALUE.fullmatch(text):
        raise ValueError(f"not a sample value: {text!r}")
    return float(text)


def _numbers(texts: list[object]) -> np.ndarray:
    """A series' values, checked with one match over them all (a check per value took most of
    the time a long range spent in this process)."""
    if texts and (not all(isinstance(text, str) for text in texts)
                  or not _VALUE_LINES.fullmatch("\n".join(texts))):  # type: ignore[arg-type]
        bad = next(text for text in texts if not isinstance(text, str) or not _ONE_VALUE.fullmatch(text))
        raise ValueError(f"not a sample value: {bad!r}")
    return np.array(texts, dtype=np.float64)


class Source:
    """One backend and one range, on the grid from `start` every `step` seconds."""

    def __init__(self, url: str, start: float, end: float, step: float,
                 progress: Callable[[str], None] | None = None) -> None:
        self.url, self.step = url.rstrip("/"), step
        self.start = math.ceil(start / step) * step
        self.size = max(0, int((end - self.start) // step) + 1)
        self.progress = progress
        self.queries = 0
        # per query (its `what`), time spent asking and parsing, AHEAD chunks at once: where it goes
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()  # queries and seconds, counted from the threads that ask

    @property
    def times(self) -> np.ndarray:
        return self.start + self.step * np.arange(self.size)

    def _get(self, path: str, params: dict[str, str]) -> object:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with self._lock:
            self.queries += 1
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as err:
            try:
                reason = json.load(err).get("error", "")
            except (ValueError, AttributeError):
                reason = ""
            raise ReportError(f"{self.url} refused {params.get('query', path)!r}: HTTP {err.code}"
                              f"{': ' + str(reason)[:300] if reason else ''}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            raise ReportError(f"cannot reach {self.url}: {reason}") from None
        except ValueError:
            raise ReportError(f"{self.url}{path} did not answer with JSON: is it a Prometheus query API?") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ReportError(f"{self.url} refused {params.get('query', path)!r}: "
                              f"{str(body.get('error', body) if isinstance(body, dict) else body)[:300]}")
        return body.get("data")

    def check(self) -> None:
        """The API answers at all (an unreachable URL fails here, before any work)."""
        self._get("/api/v1/query", {"query": "1", "time": f"{self.start:.3f}"})

    def instant(self, query: str, at: float) -> list[tuple[dict[str, str], float]]:
        """The query's vector at `at`: (labels, value) per series."""
        data = self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"})
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise ReportError(f"{self.url} answered {query!r} with no vector")
        out = []
        for item in data.get("result", []):
            try:
                out.append(({str(k): str(v) for k, v in item["metric"].items()}, _number(item["value"][1])))
            except (KeyError, TypeError, ValueError, IndexError) as err:
                print(f"warning: skipped a series of {query!r}: {err}", file=sys.stderr)
        return out

    def chunks(self, query: str, what: str = "", spans: list[slice] | None = None
               ) -> Iterator[tuple[slice, dict[Labels, np.ndarray]]]:
        """The query over `spans` of the grid (default: all of it), chunk by chunk, a span cut at
        CHUNK_POINTS, AHEAD chunks asked at once and yielded in order: (the chunk's slice of the
        grid, each series' values on it, NaN where it has no sample; float64: a timestamp needs
        its 53 bits)."""
        parts = [slice(first, min(span.stop, first + CHUNK_POINTS))
                 for span in ([slice(0, self.size)] if spans is None else spans)
                 for first in range(span.start, span.stop, CHUNK_POINTS)]
        with ThreadPoolExecutor(AHEAD) as pool:
            asked: deque[Future[dict[Labels, np.ndarray]]] = deque()
            try:
                for k, part in enumerate(parts):
                    while len(asked) < AHEAD and k + len(asked) < len(parts):
                        n = k + len(asked)
                        if self.progress:
                            self.progress(f"{what or query[:40]} {n + 1}/{len(parts)}")
                        asked.append(pool.submit(self._chunk, query, what or query, parts[n]))
                    yield part, asked.popleft().result()
            finally:  # a chunk failed, or the caller stopped reading: the rest is not wanted
                for future in asked:
                    future.cancel()

    def _chunk(self, query: str, what: str, part: slice) -> dict[Labels, np.ndarray]:
        began = time.monotonic()
        data = self._get("/api/v1/query_range", {
            "query": query, "start": f"{self.start + part.start * self.step:.3f}",
            "end": f"{self.start + (part.stop - 1) * self.step:.3f}", "step": f"{self.step:g}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise ReportError(f"{self.url} answered {query!r} with no matrix")
        out: dict[Labels, np.ndarray] = {}
        for series in data.get("result", []):
            try:
                labels = tuple(sorted((str(k), str(v)) for k, v in series["metric"].items()))
                values = np.full(part.stop - part.start, np.nan, np.float64)
                pairs = series["values"]
                if pairs:
                    stamps = np.array([pair[0] for pair in pairs], dtype=np.float64)
                    at = np.rint((stamps - self.start) / self.step).astype(np.int64) - part.start
                    inside = (at >= 0) & (at < values.size)
                    values[at[inside]] = _numbers([pair[1] for pair in pairs])[inside]
                out[labels] = values
            except (KeyError, TypeError, ValueError, IndexError) as err:  # a bad item costs that series
                print(f"warning: skipped a series of {query!r}: {err}", file=sys.stderr)
        with self._lock:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.monotonic() - began
        return out

    def range(self, query: str, what: str = "", spans: list[slice] | None = None) -> dict[Labels, np.ndarray]:
        """Each series of the query on the whole grid, asked over `spans` of it (default: all of
        it); NaN where it has no sample or was not asked."""
        out: dict[Labels, np.ndarray] = {}
        for part, chunk in self.chunks(query, what, spans):
            for labels, values in chunk.items():
                out.setdefault(labels, np.full(self.size, np.nan, np.float64))[part] = values
        return out


def terminal_progress(stream=sys.stderr) -> Callable[[str], None] | None:
    """A progress line rewritten in place, on a terminal only (logs and CI stay clean)."""
    if not stream.isatty():
        return None
    began = time.monotonic()

    def show(text: str) -> None:
        stream.write(f"\r\033[Kreading {text} ({time.monotonic() - began:.0f} s)")
        stream.flush()
    return show
