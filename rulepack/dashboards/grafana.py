"""Grafana's interpolation of a query's variables, for running a panel's query elsewhere."""

from __future__ import annotations

import re
from typing import Any

# Grafana's variable syntaxes: $name, ${name}, ${name:format}. A digit-only name ($1, a
# label_replace replacement) is no variable, and Grafana leaves it alone too.
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::(\w+))?\}|(\w+))")


def expand(expr: str, variables: dict[str, str], rate_interval: str, *,
           interval: str | None = None, range_: str | None = None, dashboard: dict[str, Any] | None = None) -> str:
    """expr as Grafana's Prometheus data source sends it, one value selected per variable.

    Grafana escapes a value for a regex only for a multi-value or include-all variable (and then
    with doubled backslashes, which PromQL's string literal halves); pass the dashboard to have
    that decided from its variables, as Grafana does. ${name:regex} escapes with single
    backslashes (Grafana's regex format): PromQL rejects them in a string, so the dashboards
    don't use it. A variable missing from `variables` is an error, so a query cannot silently
    keep a literal $name."""
    builtins = {"__rate_interval": rate_interval, "__interval": interval, "__range": range_}
    regex_escaped = {v["name"] for v in (dashboard or {}).get("templating", {}).get("list", [])
                     if v.get("multi") or v.get("includeAll")}

    def value(match: re.Match[str]) -> str:
        name, fmt = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), None)
        if name.isdigit():
            return match.group(0)
        if name in builtins:
            if builtins[name] is None:
                raise KeyError(f"${name} is used: pass it to expand()")
            return str(builtins[name])
        if name not in variables:
            raise KeyError(f"${name}: no value given for this variable")
        raw = variables[name]
        if fmt == "regex":
            return re.sub(r"[\\^$*+?.()|\[\]{}/]", r"\\\g<0>", raw)
        if name in regex_escaped:
            return re.sub(r"[$^*{}\[\]'+?.()|]", r"\\\\\g<0>", raw.replace("\\", "\\\\\\\\"))
        return raw.replace("\\", "\\\\").replace("'", "\\\\'")
    return _VARIABLE.sub(value, expr)


def parseable(expr: str) -> str:
    """expr with a placeholder for each variable (1m for Grafana's intervals), for parsing it."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        return match.group(0) if name.isdigit() else "1m" if name.startswith("__") else "x"
    return _VARIABLE.sub(value, expr)
