"""Every PromQL expression the rule pack and the dashboards are made of, parsed before a file is
written: a spec whose selectors or expressions make PromQL that Prometheus would refuse is one line
naming the spec key (exit 2), and nothing is written."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import yaml

from gpunode_common.config import ConfigError

T = TypeVar("T")


def _parse(expr: str) -> None:
    import promql_parser  # a dependency of the package; only rendering loads it

    promql_parser.parse(expr)


def _flat(value: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flat(item, f"{where}.{key}" if where else key)
    else:
        yield where, value


def changed_keys(spec: dict[str, Any]) -> list[str]:
    """The keys where the spec differs from the shipped one: where a bad expression came from."""
    from gpunode_rulepack import shipped_spec

    shipped = dict(_flat(shipped_spec()))
    return [key for key, value in _flat(spec) if shipped.get(key) != value]


def _blame(spec: dict[str, Any], what: str, err: Exception) -> ConfigError:
    keys = changed_keys(spec)
    named = ", ".join(f"'{k}'" for k in keys) if keys else "none (the shipped spec)"
    return ConfigError(f"{what} is no valid PromQL ({err}); keys changed from the shipped spec: {named}")


def check_spec(spec: dict[str, Any]) -> None:
    """The keys that hold PromQL themselves: each selector, and out_of_service; and the violation
    policies, each of which names a rule group (a name twice, two groups of one name)."""
    policies = spec["failslow"]["clock_violation_policies"]
    for policy in policies:
        if not re.fullmatch(r"[a-z0-9_]+", policy) or policies.count(policy) > 1:
            raise ConfigError(f"key 'failslow.clock_violation_policies': {policy!r}: a policy is named in "
                              "lower-case letters, digits and _, and listed once")
    for name, value in spec["selectors"].items():
        try:
            _parse(f"up{{{value}}}")
        except ValueError as err:
            raise ConfigError(f"key 'selectors.{name}': {value!r} is no list of label matchers ({err})") from None
    if spec.get("out_of_service"):
        try:
            _parse(spec["out_of_service"])
        except ValueError as err:
            raise ConfigError(f"key 'out_of_service': {spec['out_of_service']!r} is no valid PromQL ({err})") from None


def check_rules(spec: dict[str, Any], files: dict[str, str]) -> None:
    """Every rule's expression in the rendered files."""
    for name, text in files.items():
        for group in yaml.safe_load(text).get("groups", []):
            for rule in group.get("rules", []):
                try:
                    _parse(rule["expr"])
                except ValueError as err:
                    rule_name = rule.get("alert") or rule.get("record")
                    raise _blame(spec, f"rule {rule_name} ({name})", err) from None


def checked(spec: dict[str, Any], make: Callable[[], T]) -> T:
    """make() (the dashboards, whose lineage parses each query as it is built) with a bad query
    turned into the one line naming the keys."""
    try:
        return make()
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise _blame(spec, "a dashboard query", err) from None
