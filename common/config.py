"""Reading a YAML file, and a duration in it, with errors that name the key: what every program's
configuration (the node agent's --config.file, the rule pack's spec, the remediation policy) shares."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ConfigError(ValueError):
    """Names the key that is wrong; the CLI prints it on one line and exits 2."""


def seconds(value: Any, where: str) -> float:
    """A duration: a number of seconds, or a string such as "90s", "15m", "1d12h", "2w"."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: want a duration, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ConfigError(f"{where}: want a duration >= 0, got {value!r}")
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ConfigError(f"{where}: want a duration such as 90s, 15m, 2h, 3d or 1d12h, got {value!r}")
    return float(sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))


def load_yaml(path: Path, build: Callable[[Any], T]) -> T:
    """Read a YAML file and build from it; every error names the file, on one line."""
    import yaml  # only with a config file: `serve` without one never loads it

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {_yaml_error(err)}") from None
    try:
        return build(data or {})
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _yaml_error(err: Exception) -> str:
    """PyYAML's error on one line: where (line:column, 1-based) and what it found there."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or problem is None:
        return str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")
