"""gpunode-remediate: serve (the webhook receiver), status, breaker reset, check."""

from __future__ import annotations

import argparse
import logging
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

from gpunode_common import __version__, logs, webconfig
from gpunode_common.config import ConfigError
from gpunode_common.flags import Parser, listen_address
from gpunode_common.http import make_server
from gpunode_remediate import policy as policies
from gpunode_remediate.jobs import backoff_delay
from gpunode_remediate.plan import span
from gpunode_remediate.state import Breaker, State

PROG = "gpunode-remediate"
DEFAULT_LISTEN = ":19836"
log = logging.getLogger(PROG)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Turns the rule pack's alerts into scheduler actions: drain, reboot or "
                     "GPU reset once idle, return to service. Dry run unless the policy says mode: enforce.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--config.file", dest="config_file", type=Path, required=True, metavar="FILE",
                       help="the policy (YAML; docs/remediation.md)")
        return p

    serve = command("serve", "receive Alertmanager's webhooks on /alerts and act on them")
    serve.add_argument("--web.listen-address", dest="listen", default=DEFAULT_LISTEN, type=listen_address,
                       metavar="[HOST]:PORT", help=f"address to listen on (default: {DEFAULT_LISTEN})")
    serve.add_argument("--web.config.file", dest="web_config", type=Path, metavar="FILE",
                       help="exporter-toolkit web config: TLS and basic auth")
    serve.add_argument("--web.bearer-token-file", dest="token_file", type=Path, metavar="FILE",
                       help="requests must carry this token (Authorization: Bearer), as Alertmanager's "
                       "http_config.authorization.credentials_file sends it")
    serve.add_argument("--log.level", dest="log_level", default="info", choices=("debug", "info", "warn", "error"),
                       help="log level (default: info)")
    command("status", "nodes held and in the service's care: why, since when, what comes next")
    command("check", "validate the policy: exit 0, or 2 with one line")
    breaker = sub.add_parser("breaker", help="the circuit breaker", description="The circuit breaker.")
    breaker_sub = breaker.add_subparsers(dest="breaker_command", metavar="COMMAND", required=True,
                                         parser_class=Parser)
    reset = breaker_sub.add_parser("reset", help="close the circuit breaker (a person's decision)",
                                   description="Close the circuit breaker, or end a pause: new actions may happen "
                                   "again, and drains before now no longer count against the budget.")
    opened = breaker_sub.add_parser("open", help="pause: no new action until `breaker reset`",
                                    description="Open the circuit breaker by hand (a pause, for maintenance or an "
                                    "incident): no scheduler call at all until `breaker reset`.")
    opened.add_argument("--reason", required=True, help="why: status and the metrics show it")
    for p in (reset, opened):
        p.add_argument("--config.file", dest="config_file", type=Path, required=True, metavar="FILE",
                       help="the policy (YAML)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        policy = policies.load(args.config_file)
        web = webconfig.load(args.web_config) if args.command == "serve" else None
        token = _token(args.token_file) if args.command == "serve" and args.token_file else None
    except ConfigError as err:
        parser.error(str(err))
    if args.command == "check":
        print(f"{args.config_file}: valid ({policy.mode}, scheduler {policy.scheduler.kind}, "
              f"{len(policy.rules)} rules)")
        if policy.scheduler.kind == "slurm":
            _check_slurm(policy)
        return 0
    if args.command == "serve":
        return _serve(args, policy, web, token)
    try:
        state = State(policy.state_path, readonly=args.command == "status")
    except (OSError, sqlite3.Error) as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 1
    if args.command == "status":
        print(status_text(policy, state, time.time()), end="")
        return 0
    print(breaker_command(policy, state, args.breaker_command, getattr(args, "reason", ""), time.time()))
    return 0


def breaker_command(policy: policies.Policy, state: State, command: str, reason: str, now: float) -> str:
    """`breaker open` (a person's pause) or `breaker reset`; what it did and what comes next."""
    old = state.breaker(policy.mode)
    was = f"{'paused' if old.paused else 'open'} since {_when(old.since)}: {old.why}" if old.open else "closed"
    tag = "" if policy.enforce else " (dry run's breaker)"
    if command == "open":
        state.set_breaker(policy.mode, Breaker(True, True, now, reason.strip()[:200] or "no reason given",
                                               old.budget_from))
        return (f"circuit breaker opened by a person{tag} (it was {was}): no drain, reboot, reset, return or "
                "requeue until `gpunode-remediate breaker reset`")
    state.set_breaker(policy.mode, Breaker(False, False, now, "reset by a person", now))
    closed = f"circuit breaker closed{tag} (it was {was}). Drains before now no longer count"
    window = f"in the next {policy.budget.window / 3600:g}h"
    taken = "nodes whose alerts still fire are taken at its next look, first alerted first"
    counted = state.counted()
    if counted is None:
        return f"{closed}: the service may drain its budget {window}; {taken}"
    # The reset clears the window, not the nodes in care: past budget.in_care the next drain reopens it.
    budget, care, in_care = policy.budget.nodes(counted), policy.budget.care(counted), len(state.records())
    limit = (f"{in_care} node(s) in the service's care, of {care} allowed (budget.in_care "
             f"{policy.budget.in_care:g} of the {counted} counted at the last look)")
    if in_care >= care:
        return (f"{closed}, but the nodes in care do: {limit}, so in effect it may drain 0 nodes: the next drain "
                "opens the breaker again. Nodes must leave its care first: they return once resolved, held ones "
                "when a person fixes them and resumes them in the scheduler (`gpunode-remediate status` lists them)")
    if care - in_care < budget:
        return (f"{closed}: the service may drain {care - in_care} node(s) {window}, not the {budget} of its "
                f"budget: {limit}; {taken}")
    return (f"{closed}: the service may drain {budget} node(s) of the {counted} counted at the last look "
            f"{window}; {taken}")


_RETURN_TO_SERVICE = {
    2: "Slurm returns a rebooted node as soon as it registers: the service drains it again until its quiet "
       "period and GPU check pass (ReturnToService=1 spares that drain)",
}


def _check_slurm(policy: policies.Policy) -> None:
    """What the cluster's ReturnToService means for the nodes the service reboots."""
    from gpunode_remediate.command import CommandError
    from gpunode_remediate.scheduler.slurm import Slurm

    try:
        value = Slurm(policy.scheduler.scontrol, timeout=policy.scheduler.timeout).return_to_service()
    except CommandError as err:
        sys.stderr.write(f"slurm: ReturnToService not checked: {err}\n")
        return
    if value is not None:
        print(f"slurm: ReturnToService={value}: " + _RETURN_TO_SERVICE.get(
            value, "a rebooted node stays down until the service returns it"))


def _token(path: Path) -> bytes:
    try:
        token = path.read_bytes().strip()
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    if not token:
        raise ConfigError(f"{path}: empty bearer token")
    return token


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


_NEXT = {
    "drained": "returns when its alerts have been resolved for the quiet period",
    "reset_wait": "GPU reset once no job runs on it (held after idle_timeout)",
    "reset_done": "returns when resolved for the quiet period, its exporter sees every GPU and its NVLink fabric is "
                  "complete (held after fabric_wait)",
    "reboot_wait": "the scheduler reboots it once idle (held after idle_timeout)",
    "rebooting": "the reboot completes (held after reboot_timeout)",
    "rebooted": "returns when resolved for the quiet period, its exporter sees every GPU and its NVLink fabric is "
                "complete (held after fabric_wait)",
    "held": "waits for a person: resume it in the scheduler when fixed",
}


def status_text(policy: policies.Policy, state: State, now: float) -> str:
    records = state.records()
    breaker = state.breaker(policy.mode)
    history = state.history(policy, now)
    dry = "" if policy.enforce else " (dry run)"
    opened = f"{'PAUSED by a person' if breaker.paused else 'OPEN'} since {_when(breaker.since)}: {breaker.why}"
    lines = [f"mode: {policy.mode}" + ("" if policy.enforce else ": nothing below was done to the scheduler"),
             f"circuit breaker{dry}: {opened if breaker.open else 'closed'}",
             f"drained in the last {policy.budget.window / 3600:g}h{dry}: {history.budget_used} node(s)"]
    if not records:
        lines.append("no node in the service's care")
    notes = state.notes()
    for record in sorted(records.values(), key=lambda r: (r.phase != "held", r.node)):
        gpus = f" gpu {','.join(record.gpus)}" if record.gpus else ""
        note, at = notes.get(record.node, ("", 0.0))
        now_ = f"; since {_when(at)}: {note}" if note and record.phase != "held" else ""
        lines.append(f"{record.node}  {record.phase}{dry}  since {_when(record.since)}  {record.action}{gpus}: "
                     f"{record.why}; next: {_NEXT[record.phase]}{now_}")
    for node, (note, at) in sorted(notes.items()):
        if node not in records:
            lines.append(f"{node}  left alone since {_when(at)}: {note}")
    if policy.jobs.enabled:
        statuses = policy.done
        chains = state.held_chains(statuses)
        used = state.requeues_since(max(now - policy.budget.window, breaker.budget_from), statuses)
        lines.append(f"jobs requeued in the last {policy.budget.window / 3600:g}h{dry}: {used} of "
                     f"{policy.jobs.budget}; retry chains held for a person: {len(chains)}")
        for chain in chains:
            ends = [e for e in state.job_ends(chain.ended_at - policy.jobs.window, statuses) if e.job == chain.job]
            blamed = ",".join(sorted({node for e in ends for node in e.culprits})) or "none"
            shared = ",".join(chain.shared) or "none"
            lines.append(f"job {chain.job}  held{dry}  since {_when(chain.ended_at)}  {chain.attempts} abnormal "
                         f"ends; blamed: {blamed}; nodes its attempts shared: {shared}; next: a person releases "
                         f"it (scontrol release {chain.job}) or cancels it")
        for wait, since in state.storage_waits(statuses):
            lines.append(f"job {wait.job}  waiting for NFS server {wait.waits_for}{dry}  since {_when(since)}  "
                         f"attempt {wait.attempts}; blamed: none ({wait.evidence}); next: released when "
                         f"NfsServerNotResponding for {wait.waits_for} resolves, to start "
                         f"{span(backoff_delay(policy.jobs, wait.attempts))} after")
    return "\n".join(lines) + "\n"


def _serve(args: argparse.Namespace, policy: policies.Policy, web: webconfig.WebConfig, token: bytes | None) -> int:
    from gpunode_remediate.engine import Engine
    from gpunode_remediate.scheduler import build
    from gpunode_remediate.server import make_handler
    from gpunode_remediate.state import State

    logs.setup(args.log_level)
    try:
        state = State(policy.state_path)
    except (OSError, sqlite3.Error) as err:  # a broken state file is said, not traced
        sys.stderr.write(f"{PROG}: error: state file {policy.state_path}: {err}\n")
        return 1
    engine = Engine(policy, state, build(policy))
    try:
        server = make_server(args.listen, make_handler(engine, web, token), web)
    except OSError as err:
        sys.stderr.write(f"{PROG}: error: cannot listen on {args.listen}: {err.strerror}\n")
        return 1
    log.info("listening on %s (%s); mode %s%s", args.listen, "TLS" if web.ssl_context else "plain HTTP",
             policy.mode, "" if policy.enforce else ": decisions are logged, the scheduler is not called")
    stop = threading.Event()
    worker = threading.Thread(target=engine.run_forever, args=(stop,), name="remediate", daemon=True)
    worker.start()
    engine.wake.set()

    def _shutdown(signum: int, _frame: object) -> None:
        log.info("received signal %d, shutting down", signum)
        stop.set()
        engine.wake.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    server.serve_forever()
    server.server_close()
    worker.join(timeout=policy.scheduler.timeout + 5)
    state.close()
    return 0
