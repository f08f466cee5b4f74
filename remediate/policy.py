"""The policy file: which alert asks for which node action, and the limits on acting.

Every key has a default; an unknown key or a wrong type is one line naming the key (exit 2), as
the exporter's --config.file and the rule spec are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode_common.config import ConfigError, load_yaml, seconds

# Node actions, mildest first: a node wanted for several takes the strongest.
ACTIONS = ("none", "drain", "reset", "reboot", "hold")
DEFAULT_STATE = Path("/var/lib/gpunode-remediate/state.db")
# The host part of an `instance` label: "gpu071:19835" or "gpu071.cluster.local:19835" -> gpu071.
DEFAULT_NODE_PATTERN = r"^\[?([^:.\]]+)"

_STRAGGLER = "the node slows its job: it takes no new job"


@dataclass(frozen=True)
class Rule:
    """Alerts named `alertname` whose labels match `labels` (regexes, fully anchored) ask for `action`."""

    alertname: str
    action: str
    labels: tuple[tuple[str, re.Pattern[str]], ...] = ()
    why: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        return labels.get("alertname") == self.alertname and all(
            pattern.fullmatch(labels.get(name, "")) for name, pattern in self.labels)


def _rule(alertname: str, do: str, why: str, **labels: str) -> Rule:
    return Rule(alertname, do, tuple((k, re.compile(v)) for k, v in labels.items()), why)


# The Lablup B200 operations report's Xid-aware branching (sections 2.3 and 4.3): hardware-action
# Xids isolate the node, RESTART_BM reboots it, RESET_GPU resets the GPU, application Xids are only
# recorded; what a reset or reboot cannot cure waits for a person. First match wins.
DEFAULT_RULES: tuple[Rule, ...] = (
    _rule("GpuXidHardwareFault", "reboot", "Xid needs a node reboot", action="RESTART_BM|RESTART_VM"),
    _rule("GpuXidHardwareFault", "reset", "Xid needs a GPU reset", action="RESET_GPU"),
    _rule("GpuXidHardwareFault", "hold", "Xid needs a person", action="CONTACT_SUPPORT|CHECK_MECHANICALS|UPDATE_SWFW"),
    _rule("GpuXidHardwareFault", "drain", "hardware Xid: diagnose before the next job"),
    _rule("GpuRecoveryActionRequired", "reboot", "driver asks for a node reboot",
          action="RESTART_BM|SYSTEM_REBOOT"),
    _rule("GpuRecoveryActionRequired", "reset", "driver asks for a GPU reset",
          action="RESET_GPU|DRAIN_AND_RESET|BUS_RESET"),
    _rule("GpuRecoveryActionRequired", "drain", "driver asks to drain the node"),
    _rule("GpuDown", "reboot", "a GPU fell off the bus"),
    _rule("GpuNodeGpuMissing", "reboot", "the node sees fewer GPUs than it has"),
    _rule("GpuRowRemapPending", "reset", "row remaps wait for a GPU reset"),
    _rule("GpuRowRemapFailure", "hold", "row remapping failed: replace the GPU"),
    _rule("GpuRowRemapBanksExhausted", "hold", "a memory bank has no spare rows left"),
    _rule("GpuRowRemapUncorrectableIncrease", "hold", "uncorrectable row remaps rise"),
    # Precursors: act before the loss (the report's gpu124 vanished with its job weeks after its
    # trend showed). A hold lets the running job finish and takes no new one; a person replaces
    # the part. GpuNodePrecursorMultiSignal has no rule: in the fleet replay (docs/remediation.md)
    # draining on it took a node with no fault, spent the budget, and the breaker then left six
    # real faults alone; it tells people instead.
    _rule("GpuRowRemapCorrectableAcceleration", "hold", "correctable row remaps accelerate: replace the GPU"),
    _rule("GpuXidRepeatedHardwareFaults", "hold", "hardware Xids repeat on this node: diagnose it"),
    _rule("GpuNodeClockThrottled", "drain", _STRAGGLER),
    _rule("GpuNvLinkDegraded", "drain", _STRAGGLER),
    _rule("GpuNodeFabricLinkErrors", "drain", _STRAGGLER),
    _rule("GpuPcieLinkDegraded", "drain", _STRAGGLER),
    _rule("GpuNodeHostStarved", "drain", _STRAGGLER),
    _rule("GpuXidApplicationFault", "none", "application Xid: the job retries, the node stays"),
    # Beyond the GPU: the NVSwitch fabric, the host's kernel log, storage. What a reboot clears
    # (a wedged fabric manager, hung tasks, a lockup, a GPU driver that lost its GSP) reboots;
    # what is hardware (a port, a NIC, memory, PCIe, a disk) waits for a person.
    _rule("GpuNvSwitchFatalError", "reboot", "fatal NVSwitch error: the fabric needs a node reboot"),
    _rule("GpuFabricNotReady", "reboot", "the NVLink fabric is not ready: a reboot brings it up"),
    _rule("GpuNodeFabricPortDown", "hold", "a fabric port is down: check the cable and transceiver"),
    _rule("GpuNodeFabricPortFlapping", "hold", "a fabric port flaps: check the cable and transceiver"),
    _rule("GpuNodeFabricPortDegraded", "hold", "a fabric port runs degraded: check the cable and transceiver"),
    _rule("GpuNodeNicFault", "hold", "the NIC reports a hardware or firmware fault"),
    _rule("GpuNodeMemoryUncorrectable", "hold", "uncorrectable host memory error: replace the DIMM"),
    _rule("GpuNodeMemoryCorrectableRate", "hold", "corrected host memory errors at a rate: replace the DIMM"),
    _rule("GpuNodePcieUncorrectable", "hold", "uncorrectable PCIe error: diagnose the device"),
    _rule("GpuNodeFilesystemReadOnly", "hold", "a filesystem went read-only: check the disk"),
    _rule("GpuNodeDiskErrors", "hold", "disk errors: check the disk"),
    _rule("GpuNodeHungTasks", "reboot", "hung tasks: a reboot clears them"),
    _rule("GpuNodeCpuLockup", "reboot", "a CPU locked up: reboot the node"),
    # The rule pack silences it while a hardware Xid is recent on the node: that Xid's rule acts.
    _rule("GpuNodeGpuDriverFault", "reboot", "the GPU driver failed: reboot the node"),
    _rule("GpuNodeOomKills", "none", "the job's own memory: the node stays"),
    _rule("NfsServerNotRespondingOnNode", "none", "the NFS server's fault, not the node's"),
    # No node label: never a node's action; job recovery waits for the server (remediate/jobs.py).
    _rule("NfsServerNotResponding", "none", "the NFS server does not answer: jobs wait for it"),
)


@dataclass(frozen=True)
class Budget:
    fraction: float = 0.05  # of the counted nodes (plan.counted): drains per window
    minimum: int = 1
    window: float = 86400.0
    maximum: int | None = None  # drains per window at most, whatever the fraction gives
    in_care: float = 0.1  # of the counted nodes in the service's care at once, held included

    def nodes(self, counted: int) -> int:
        nodes = max(self.minimum, int(self.fraction * counted))
        return nodes if self.maximum is None else min(nodes, self.maximum)

    def care(self, counted: int) -> int:
        """Nodes the service may hold in its care at once."""
        return max(self.minimum, int(self.in_care * counted))


@dataclass(frozen=True)
class Nodes:
    """The nodes the service may act on and counts in its budget; None: all (include), none (exclude)."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None

    def selects(self, node: str) -> bool:
        return ((self.include is None or self.include.fullmatch(node) is not None)
                and (self.exclude is None or self.exclude.fullmatch(node) is None))


@dataclass(frozen=True)
class Alertmanager:
    """Lost resolutions: a firing alert Alertmanager no longer lists in any state counts as resolved."""

    url: str | None = None
    receiver: str = "gpunode-remediate"
    interval: float = 60.0
    stale_after: float = 600.0


@dataclass(frozen=True)
class RepeatOffender:
    drains: int = 3
    window: float = 7 * 86400.0


@dataclass(frozen=True)
class Requeue:
    enabled: bool = False
    backoff: tuple[float, ...] = (600.0, 1200.0, 2400.0)  # between requeues of one job; then hold


@dataclass(frozen=True)
class Select:
    """The jobs job recovery may requeue, beyond Slurm's own Requeue=1 on a batch job."""

    partitions: tuple[str, ...] = ()  # none: all
    name: re.Pattern[str] | None = None  # the job's name, fully anchored; None: any
    min_nodes: int = 1


@dataclass(frozen=True)
class Lemon:
    jobs: int = 3  # different jobs whose failed attempts blame one node
    window: float = 7 * 86400.0


@dataclass(frozen=True)
class Jobs:
    """Job recovery (remediate/jobs.py): the contract's keys, and culprit_wait."""

    enabled: bool = False
    select: Select = field(default_factory=Select)
    exit_codes: frozenset[int] | None = None  # None: any non-zero exit
    on_node_fault: str = "requeue"  # or stop: hold the job for a person
    backoff: tuple[float, ...] = (600.0, 1200.0, 2400.0)
    max_attempts: int = 4
    window: float = 86400.0
    lemon: Lemon = field(default_factory=Lemon)
    budget: int = 20  # requeues per budget.window
    # An end with no culprit yet waits this long for the rule pack's alerts: the Xid that killed the
    # job reaches Alertmanager a minute or two later, a fabric port's alert after its 2-minute `for`
    # (fabric.down_for), 2-3.5 minutes after the end. Slurm keeps the record MinJobAge (300 s).
    culprit_wait: float = 240.0


@dataclass(frozen=True)
class Scheduler:
    kind: str = "slurm"
    scontrol: str = "scontrol"
    squeue: str = "squeue"  # the jobs a node runs (requeue)
    timeout: float = 30.0
    retries: int = 5  # a failed call is tried again after 2, 4, 8 ... s, at most this many times
    # kind: commands; argv templates with {node}, {reason}, {job}; `nodes` prints JSON (docs).
    commands: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthCheck:
    # The node's exporter, asked for its GPU count before a rebooted or reset node returns.
    url: str = "http://{node}:19835/metrics"
    timeout: float = 5.0
    enabled: bool = True


@dataclass(frozen=True)
class Policy:
    mode: str = "dry-run"
    state_path: Path = DEFAULT_STATE
    scheduler: Scheduler = field(default_factory=Scheduler)
    node_label: str = "instance"
    node_pattern: re.Pattern[str] = re.compile(DEFAULT_NODE_PATTERN)
    budget: Budget = field(default_factory=Budget)
    repeat_offender: RepeatOffender = field(default_factory=RepeatOffender)
    reboot_repeat_window: float = 7 * 86400.0  # a second reboot Xid within it holds the node
    quiet_period: float = 900.0
    reset_command: tuple[str, ...] = ()
    reset_timeout: float = 600.0
    requeue: Requeue = field(default_factory=Requeue)
    jobs: Jobs = field(default_factory=Jobs)
    health_check: HealthCheck = field(default_factory=HealthCheck)
    interval: float = 15.0  # how often the scheduler is looked at without a notification
    rules: tuple[Rule, ...] = DEFAULT_RULES
    alertmanager: Alertmanager = field(default_factory=Alertmanager)
    nodes: Nodes = field(default_factory=Nodes)
    idle_timeout: float = 86400.0  # a node waiting for its jobs to end before a reset or reboot: then held
    reboot_timeout: float = 1800.0  # a reboot not complete by then holds the node
    # A rebooted or reset node ready to return whose NVLink fabric is not complete (or whose exporter
    # does not answer) waits at most this long, then it is held.
    fabric_wait: float = 600.0
    validate_command: tuple[str, ...] = ()  # run before every return; a non-zero exit holds the node
    validate_timeout: float = 900.0  # dcgmi diag -r 2 takes minutes; a check past this has failed

    @property
    def enforce(self) -> bool:
        return self.mode == "enforce"

    @property
    def done(self) -> tuple[str, ...]:
        """Action statuses that count as done: a dry run's decisions count in its own mode."""
        return ("done",) if self.enforce else ("done", "dry_run")

    @property
    def tried(self) -> tuple[str, ...]:
        """Statuses a budget counts: a call that failed or was cut short may have taken effect."""
        return self.done + (("failed", "interrupted", "pending") if self.enforce else ())

    def action(self, labels: dict[str, str]) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(labels)), None)

    def node(self, labels: dict[str, str]) -> str | None:
        match = self.node_pattern.search(labels.get(self.node_label, ""))
        return match.group(1) if match and match.group(1) else None


COMMAND_NAMES = ("nodes", "drain", "resume", "reboot", "requeue")


def _keys(data: Any, known: set[str], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'top level'}: want a mapping, got {type(data).__name__}")
    for key in data:
        if key not in known:
            raise ConfigError(f"unknown key '{where + '.' if where else ''}{key}'")
    return data


def _number(value: Any, where: str, low: float = 0, high: float = float("inf"), whole: bool = False) -> float:
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        raise ConfigError(f"key '{where}': want a {'whole ' if whole else ''}number from {low:g} to {high:g}, "
                          f"got {value!r}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"key '{where}': want a string, got {value!r}")
    return value


def _argv(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"key '{where}': want a command as a list of strings, got {value!r}")
    return tuple(value)


def _regex(value: Any, where: str) -> re.Pattern[str]:
    try:
        return re.compile(_string(value, where))
    except re.error as err:
        raise ConfigError(f"key '{where}': not a regular expression: {err}") from None


def _duration(value: Any, where: str) -> float:
    return seconds(value, f"key '{where}'")


def _section(cls: type, data: Any, where: str, fields_: dict[str, Any]) -> Any:
    data = _keys(data, set(fields_), where)
    return cls(**{k: fields_[k](v, f"{where}.{k}") for k, v in data.items()})


def _scheduler(data: Any, where: str) -> Scheduler:
    data = _keys(data, {"kind", "scontrol", "squeue", "timeout", "retries", "commands"}, where)
    kind = data.get("kind", "slurm")
    if kind not in ("slurm", "commands"):
        raise ConfigError(f"key '{where}.kind': want slurm or commands, got {kind!r}")
    commands = _keys(data.get("commands", {}), set(COMMAND_NAMES), f"{where}.commands")
    if kind == "commands":
        missing = [name for name in COMMAND_NAMES if name not in commands and name != "requeue"]
        if missing:
            raise ConfigError(f"key '{where}.commands': kind commands needs {', '.join(missing)}")
    return Scheduler(
        kind=kind, scontrol=_string(data.get("scontrol", "scontrol"), f"{where}.scontrol"),
        squeue=_string(data.get("squeue", "squeue"), f"{where}.squeue"),
        timeout=_duration(data.get("timeout", 30), f"{where}.timeout"),
        retries=int(_number(data.get("retries", 5), f"{where}.retries", 0, 100, whole=True)),
        commands={k: _argv(v, f"{where}.commands.{k}") for k, v in commands.items()})


def _rules(value: Any, where: str) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"key '{where}': want a list of rules, got {value!r}")
    rules = []
    for n, item in enumerate(value):
        at = f"{where}[{n}]"
        item = _keys(item, {"alertname", "action", "labels", "why"}, at)
        action = item.get("action")
        if action not in ACTIONS:
            raise ConfigError(f"key '{at}.action': want one of {', '.join(ACTIONS)}, got {action!r}")
        labels = _keys(item.get("labels", {}), set(item.get("labels", {}) or {}), f"{at}.labels")
        rules.append(Rule(_string(item.get("alertname"), f"{at}.alertname"), action,
                          tuple((k, _regex(v, f"{at}.labels.{k}")) for k, v in labels.items()),
                          str(item.get("why", ""))))
    return tuple(rules)


def _mode(value: Any, where: str) -> str:
    if value not in ("dry-run", "enforce"):
        raise ConfigError(f"key '{where}': want dry-run or enforce, got {value!r}")
    return value


def _node_pattern(value: Any, where: str) -> re.Pattern[str]:
    pattern = _regex(value, where)
    if pattern.groups < 1:
        raise ConfigError(f"key '{where}': want a group that captures the node name, got {value!r}")
    return pattern


def _placeholders(value: Any, where: str, allowed: set[str]) -> tuple[str, ...]:
    argv = _argv(value, where)
    for word in argv:
        for name in re.findall(r"{(\w*)}", word):
            if name not in allowed:
                raise ConfigError(f"key '{where}': unknown placeholder {{{name}}} (known: "
                                  f"{', '.join(sorted(allowed))})")
    return argv


def build(data: Any) -> Policy:
    data = _keys(data, {f for f in Policy.__dataclass_fields__}, "")
    parse = {
        "mode": _mode,
        "state_path": lambda v, w: Path(_string(v, w)),
        "scheduler": _scheduler,
        "node_label": _string,
        "node_pattern": _node_pattern,
        "budget": lambda v, w: _section(Budget, v, w, {
            "fraction": lambda x, at: float(_number(x, at, 0, 1)),
            "minimum": lambda x, at: int(_number(x, at, 0, 1e6, whole=True)), "window": _duration,
            "maximum": lambda x, at: int(_number(x, at, 0, 1e6, whole=True)),
            "in_care": lambda x, at: float(_number(x, at, 0, 1))}),
        "nodes": lambda v, w: _section(Nodes, v, w, {"include": _regex, "exclude": _regex}),
        "alertmanager": lambda v, w: _section(Alertmanager, v, w, {
            "url": _url, "receiver": _string, "interval": lambda x, at: max(1.0, _duration(x, at)),
            "stale_after": _duration}),
        "idle_timeout": _duration,
        "reboot_timeout": _duration,
        "fabric_wait": _duration,
        "validate_command": lambda v, w: _placeholders(v, w, {"node"}),
        "validate_timeout": _duration,
        "repeat_offender": lambda v, w: _section(RepeatOffender, v, w, {
            "drains": lambda x, at: int(_number(x, at, 1, 1000, whole=True)), "window": _duration}),
        "reboot_repeat_window": _duration,
        "quiet_period": _duration,
        "reset_command": lambda v, w: _placeholders(v, w, {"node", "gpu"}),
        "reset_timeout": _duration,
        "requeue": lambda v, w: _section(Requeue, v, w, {
            "enabled": _boolean, "backoff": _durations}),
        "jobs": _jobs,
        "health_check": lambda v, w: _section(HealthCheck, v, w, {
            "url": _string, "timeout": _duration, "enabled": _boolean}),
        "interval": lambda v, w: max(1.0, _duration(v, w)),
        "rules": _rules,
    }
    policy = Policy(**{key: parse[key](value, key) for key, value in data.items()})
    if policy.jobs.enabled and policy.scheduler.kind != "slurm":
        raise ConfigError("key 'jobs.enabled': job recovery needs scheduler.kind slurm")
    if policy.scheduler.kind == "commands":
        for name, argv in policy.scheduler.commands.items():
            _placeholders(list(argv), f"scheduler.commands.{name}", {"node", "reason", "job"})
    return policy


def _durations(value: Any, where: str) -> tuple[float, ...]:
    return tuple(_duration(item, f"{where}[{n}]") for n, item in enumerate(_list(value, where)))


def _whole(low: int, high: int) -> Any:
    return lambda x, at: int(_number(x, at, low, high, whole=True))


def _jobs(value: Any, where: str) -> Jobs:
    def on_node_fault(x: Any, at: str) -> str:
        if x not in ("requeue", "stop"):
            raise ConfigError(f"key '{at}': want requeue or stop, got {x!r}")
        return x

    def exit_codes(x: Any, at: str) -> frozenset[int]:
        return frozenset(_whole(1, 255)(item, f"{at}[{n}]") for n, item in enumerate(_list(x, at)))

    return _section(Jobs, value, where, {
        "enabled": _boolean,
        "select": lambda v, w: _section(Select, v, w, {
            "partitions": lambda x, at: tuple(_string(p, f"{at}[{n}]") for n, p in enumerate(_list(x, at))),
            "name": _regex, "min_nodes": _whole(1, 1_000_000)}),
        "exit_codes": exit_codes, "on_node_fault": on_node_fault, "backoff": _durations,
        "max_attempts": _whole(1, 1000), "window": _duration,
        "lemon": lambda v, w: _section(Lemon, v, w, {"jobs": _whole(1, 1000), "window": _duration}),
        "budget": _whole(0, 1_000_000), "culprit_wait": _duration})


def _url(value: Any, where: str) -> str:
    text = _string(value, where)
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise ConfigError(f"key '{where}': want an http:// or https:// URL, got {value!r}")
    return text.rstrip("/")


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"key '{where}': want true or false, got {value!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"key '{where}': want a list, got {value!r}")
    return value


def load(path: Path) -> Policy:
    return load_yaml(path, build)
