"""`python -m demo [--scenario NAME|FILE] [--duration SECONDS]`: run the demo, print alerts as they arrive."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from demo import scenario as scenarios
from demo.stack import Ports, Stack
from demo.webhook import Received
from exporter.config import ConfigError


def matches(got: Received, want: dict[str, str], instance: str) -> bool:
    return got.status == "firing" and got.labels.get("instance") == instance and all(
        got.labels.get(k) == v for k, v in want.items())


def missing(stack: Stack) -> list[str]:
    """Expected alerts that have not reached the webhook yet, as 'node: label set'."""
    received = stack.webhook.alerts()
    return [f"{node.name}: {want}" for node in stack.nodes for want in node.scenario.expect
            if not any(matches(got, want, node.name) for got in received)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--scenario", action="append", help="demo/scenarios/NAME.yaml or a file; repeat for "
                        "more nodes (default: faulty)")
    parser.add_argument("--duration", type=float, help="seconds to run (default: the scenario's; 0 = until Ctrl-C)")
    parser.add_argument("--workdir", type=Path, help="keep configs, logs and data here (default: a temporary dir)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpunode-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        chosen = [scenarios.load(name, workdir) for name in args.scenario or ["faulty"]]
    except ConfigError as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2
    duration = args.duration if args.duration is not None else max(s.duration for s in chosen)

    def say(text: str) -> None:
        print(text, flush=True)

    with Stack(chosen, workdir, Ports(), on_alert=lambda got: say(got.line()), say=say) as stack:
        say(f"demo: {', '.join(f'{n.name} ({n.scenario.description})' for n in stack.nodes)}")
        say(f"demo: Prometheus {stack.prometheus_url}  Alertmanager {stack.alertmanager_url}  "
            f"webhook :{stack.ports.webhook}  files and logs in {workdir}")
        say("demo: alerts print below as Alertmanager delivers them" +
            (f"; stopping after {duration:.0f} s" if duration else "; Ctrl-C stops"))
        try:
            while not duration or stack.elapsed() < duration:
                if dead := stack.failed():
                    say(f"demo: exited: {', '.join(dead)}; see {workdir}/logs")
                    return 1
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        left = missing(stack)
    say("demo: every expected alert arrived" if not left
        else "demo: expected, not (yet) received:\n  " + "\n  ".join(left))
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
