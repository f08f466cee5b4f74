"""`python -m demo [--scenario NAME|FILE] [--duration SECONDS] [--keep]`: run the demo, print alerts as
they arrive, stop once every alert the scenarios expect has arrived."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from demo import scenario as scenarios
from demo.stack import Ports, Stack
from demo.webhook import Received
from gpunode_common.config import ConfigError
from gpunode_remediate.policy import build as remediate_policy

POLL_SECONDS = 0.5


def matches(got: Received, want: dict[str, str], instance: str) -> bool:
    return got.status == "firing" and got.labels.get("instance") == instance and all(
        got.labels.get(k) == v for k, v in want.items())


def to_drain(stack: Stack) -> list[str]:
    """The nodes whose expected alerts the remediation service's default policy takes out of service."""
    policy = remediate_policy({})
    return [node.name for node in stack.nodes
            if any((rule := policy.action(want)) and rule.action != "none" for want in node.scenario.expect)]


def missing(stack: Stack) -> list[str]:
    """Expected alerts that have not reached the webhook yet, as 'node: label set', and nodes not yet
    drained in the demo's slurmctld."""
    received = stack.webhook.alerts()
    drained = stack.drained()
    return [f"{node.name}: {want}" for node in stack.nodes for want in node.scenario.expect
            if not any(matches(got, want, node.name) for got in received)] + [
        f"{name}: drained by gpunode-remediate in slurmctld" for name in to_drain(stack) if name not in drained]


def expected(stack: Stack) -> int:
    return sum(len(node.scenario.expect) for node in stack.nodes)


def bound(chosen: list[scenarios.Scenario], duration: float | None) -> float:
    """How long the demo may run: --duration, else the longest scenario's (0: no bound)."""
    return max(s.duration for s in chosen) if duration is None else duration


@dataclass(frozen=True)
class Ending:
    """Why the demo stopped, when (seconds since its start), and what was still missing then."""

    reason: Literal["arrived", "duration", "interrupted", "exited"]
    elapsed: float
    missing: list[str]
    exited: list[str]


def watch(stack: Stack, duration: float | None = None, say: Callable[[str], None] = lambda _s: None) -> Ending:
    """Until every expected alert has arrived, `duration` seconds have passed (default: the longest
    scenario's), a process exits, or Ctrl-C. With duration 0 only Ctrl-C or an exit ends it: the
    stack stays up to be looked at, and the arrival is only said."""
    limit = bound([n.scenario for n in stack.nodes], duration)
    said = False
    reasons: dict[str, str] = {}
    resets = 0
    try:
        while not (dead := stack.failed()):
            for line in stack.resets()[resets:]:
                resets += 1
                say(f"{stack.elapsed():5.0f} s  gpunode-remediate: {line}")
            for node, reason in stack.drained().items():
                if reasons.get(node) != reason:
                    reasons[node] = reason
                    say(f"{stack.elapsed():5.0f} s  slurmctld: {node} out of service, reason: {reason}")
            left = missing(stack)
            if expected(stack) and not left:
                if limit:
                    return Ending("arrived", stack.elapsed(), [], [])
                if not said:
                    said = True
                    say(f"demo: all {expected(stack)} expected alerts arrived in {stack.elapsed():.0f} s; "
                        "Ctrl-C stops")
            if limit and stack.elapsed() >= limit:
                return Ending("duration", stack.elapsed(), left, [])
            time.sleep(POLL_SECONDS)
        return Ending("exited", stack.elapsed(), missing(stack), dead)
    except KeyboardInterrupt:
        return Ending("interrupted", stack.elapsed(), missing(stack), [])


def verdict(stack: Stack, ending: Ending) -> tuple[str, int]:
    """The final line (lines, when alerts are missing or a process exited) and the exit status."""
    took = f"{ending.elapsed:.0f} s"
    if ending.reason == "arrived":
        return f"demo: all {expected(stack)} expected alerts arrived in {took}; stopped", 0
    if ending.exited:
        tails = "\n".join(f"  {name}: {stack.log_tail(name)}" for name in ending.exited)
        return f"demo: stopped after {took}: {', '.join(ending.exited)} exited\n{tails}", 1
    if ending.missing:
        return f"demo: stopped after {took}; expected, not received:\n  " + "\n  ".join(ending.missing), 1
    if expected(stack):
        return f"demo: stopped after {took}; all {expected(stack)} expected alerts had arrived", 0
    return f"demo: stopped after {took}; no alert expected", 0


@contextlib.contextmanager
def workspace(given: Path | None, keep: bool) -> Iterator[Path]:
    """The demo's configs, logs and data: `given` (kept), else a temporary directory removed on the
    way out, however the demo ends, unless `keep`."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix="gpunode-demo-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (kill, a CI job's timeout) stops the demo as Ctrl-C does: processes, namespaces and
    files cleaned up."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def say(text: str) -> None:
    print(text, flush=True)


def run(chosen: list[scenarios.Scenario], workdir: Path, duration: float | None, kept: bool) -> int:
    with Stack(chosen, workdir, Ports(), on_alert=lambda got: say(got.line()), say=say) as stack:
        limit = bound(chosen, duration)
        say(f"demo: {', '.join(f'{n.name} ({n.scenario.description})' for n in stack.nodes)}")
        say(f"demo: Prometheus {stack.prometheus_url}  Alertmanager {stack.alertmanager_url}  "
            f"webhook :{stack.ports.webhook}  files and logs in {workdir}" +
            ("" if kept else " (removed at the end; --keep keeps them)"))
        until = (f"until all {expected(stack)} expected alerts arrive, at most " if expected(stack) else "for ")
        say("demo: alerts print below as Alertmanager delivers them; " +
            (f"running {until}{limit:.0f} s" if limit else "Ctrl-C stops"))
        ending = watch(stack, limit, say)
    line, status = verdict(stack, ending)
    say(line)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--scenario", action="append", help="demo/scenarios/NAME.yaml or a file; repeat for "
                        "more nodes (default: faulty)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds if the expected alerts have "
                        "not all arrived by then (default: the scenario's; 0 = run until Ctrl-C)")
    parser.add_argument("--workdir", type=Path, help="keep configs, logs and data here (default: a temporary dir, "
                        "removed at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary dir (its path is printed)")
    args = parser.parse_args(argv)
    with sigterm_as_ctrl_c(), workspace(args.workdir, args.keep) as workdir:
        try:
            chosen = [scenarios.load(name, workdir) for name in args.scenario or ["faulty"]]
        except ConfigError as err:
            print(f"demo: {err}", file=sys.stderr)
            return 2
        try:
            return run(chosen, workdir, args.duration, kept=args.keep or args.workdir is not None)
        except RuntimeError as err:  # a process that would not start; the stack is down again
            print(f"demo: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # while starting: the stack is down again
            print("demo: interrupted while starting", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
