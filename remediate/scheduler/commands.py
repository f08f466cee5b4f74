"""Any other scheduler through the operator's command templates ({node}, {reason}, {job}).

`nodes` prints a JSON list, one object per node: {"name": ..., "state": "idle|allocated|mixed|down|
drained|draining|...", "reason": "...", "flags": [...], "jobs": [...]} (all but name optional)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpunode_remediate.command import CommandError, run
from gpunode_remediate.plan import NodeView

_STATES = {"drained": ("idle", "drain"), "draining": ("allocated", "drain")}


def _strings(value: object) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


class Commands:
    def __init__(self, templates: Mapping[str, tuple[str, ...]], timeout: float = 30.0) -> None:
        self.templates = templates
        self.timeout = timeout

    def _call(self, name: str, node: str = "", reason: str = "", job: str = "") -> str:
        values = {"node": node, "reason": reason, "job": job}
        return run([word.format_map(values) for word in self.templates[name]], self.timeout)

    def nodes(self, with_jobs: bool = False) -> dict[str, NodeView]:
        try:
            data = json.loads(self._call("nodes"))
        except ValueError as err:
            raise CommandError(f"scheduler command 'nodes' printed no JSON list: {err}") from None
        if not isinstance(data, list):
            raise CommandError("scheduler command 'nodes' printed no JSON list")
        out = {}
        for item in data:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                continue  # a bad item costs that item alone
            state = str(item.get("state", "unknown")).lower()
            state, flag = _STATES.get(state, (state, ""))
            flags = frozenset({*(f.lower() for f in _strings(item.get("flags"))), *([flag] if flag else [])})
            reason = item.get("reason") if isinstance(item.get("reason"), str) else ""
            out[item["name"]] = NodeView(item["name"], state, flags, reason, _strings(item.get("jobs")))
        return out

    def drain(self, node: str, reason: str) -> None:
        self._call("drain", node=node, reason=reason)

    def reboot(self, node: str, reason: str) -> None:
        self._call("reboot", node=node, reason=reason)

    def resume(self, node: str) -> None:
        self._call("resume", node=node)

    def returns_rebooted(self) -> bool:
        return False  # the operator's reboot command keeps the node out until `resume`, as documented

    def requeue(self, job: str) -> None:
        if "requeue" not in self.templates:
            raise CommandError("no requeue command configured (scheduler.commands.requeue)")
        self._call("requeue", job=job)
