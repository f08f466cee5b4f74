"""Command line: serve (the default), dump; node_exporter-style flags."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from exporter import __version__, config, logs, process, webconfig
from exporter.collector import COLLECTORS, Collector, Context
from exporter.exposition import Renderer
from exporter.flags import Parser, listen_address
from exporter.http import ThreadingHTTPServer, make_handler, make_server
from exporter.netroute import CachedLookup, route_device
from exporter.rulepack import TARGETS, TIERS
from exporter.scrape import Scraper

PROG = "gpunode-exporter"
DEFAULT_LISTEN = ":19835"
COMMANDS = ("serve", "dump", "doctor", "rules", "dashboards", "report")


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("--path.procfs", dest="procfs", type=Path, default=Path("/proc"),
                   metavar="DIR", help="procfs mountpoint; elsewhere than /proc (a host's /proc in a container), "
                   "NFS mounts are read from its PID 1, the host's init (default: /proc)")
    p.add_argument("--path.sysfs", dest="sysfs", type=Path, default=Path("/sys"),
                   metavar="DIR", help="sysfs mountpoint (default: /sys)")
    p.add_argument("--path.kmsg", dest="kmsg", type=Path, default=Path("/dev/kmsg"), metavar="FILE",
                   help="the kernel log device; a file of records in its format is followed as it "
                   "grows (replays, tests) (default: /dev/kmsg)")
    p.add_argument("--path.state", dest="state_dir", type=Path, default=Path("/var/lib/gpunode-exporter"),
                   metavar="DIR", help="where Xid counts are kept across restarts; dump reads it "
                   "but never writes (default: /var/lib/gpunode-exporter)")
    p.add_argument("--config.file", dest="config_file", type=Path, metavar="FILE",
                   help="optional YAML configuration (see README)")
    p.add_argument("--nvml.simulate", dest="nvml_simulate", type=Path, metavar="FILE",
                   help="use a simulated NVML driven by this scenario file instead of the driver "
                   "(tests and demos; every scrape then carries gpunode_nvml_simulated 1)")
    p.add_argument("--log.level", dest="log_level", default="info",
                   choices=("debug", "info", "warn", "error"), help="log level (default: info)")
    p.add_argument("--collector.disable-defaults", dest="disable_defaults", action="store_true",
                   help="enable only the collectors named with --collector.NAME")
    for name, cls in sorted(COLLECTORS.items()):
        state = "enabled" if cls.default_enabled else "disabled"
        p.add_argument(f"--collector.{name}", dest=f"collector_{name}",
                       action=argparse.BooleanOptionalAction, default=None,
                       help=f"{cls.description} (default: {state})")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="GPU training-node exporter for Prometheus.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve metrics over HTTP (the default)",
                           description="Serve metrics over HTTP (the default command). Other commands: "
                           "`dump` (collect once, print the exposition, exit), `doctor` (check this node, say what "
                           "to fix), `rules render` (the rule pack), "
                           "`dashboards render` (the Grafana dashboards), `report` (the fleet's operational report "
                           "from its Prometheus); `gpunode-exporter COMMAND --help` "
                           "for each.")
    _common_flags(serve)
    serve.add_argument("--web.listen-address", dest="listen", default=DEFAULT_LISTEN, type=listen_address,
                       metavar="[HOST]:PORT", help=f"address to listen on (default: {DEFAULT_LISTEN})")
    serve.add_argument("--web.telemetry-path", dest="telemetry_path", default="/metrics",
                       metavar="PATH", help="path under which to expose metrics (default: /metrics)")
    serve.add_argument("--web.config.file", dest="web_config", type=Path, metavar="FILE",
                       help="exporter-toolkit web config: TLS and basic auth")
    serve.add_argument("--web.max-requests", dest="max_requests", type=int, default=40, metavar="N",
                       help="concurrent scrapes served at most; more get 503, 0 means no limit (default: 40)")
    dump = sub.add_parser("dump", help="collect once, print the exposition to stdout, exit",
                          description="Collect once, print the exposition to stdout, exit.")
    _common_flags(dump)
    doctor = sub.add_parser("doctor", help="check this node as each collector will see it; say what to fix",
                            description="Check this node as each collector will see it (NVML, GPUs, the "
                            "kernel log, the state directory, NFS mounts, storage interfaces, GPU processes' "
                            "files, the config files) and say what to fix. Exit status 1 when an enabled "
                            "collector cannot work. Give it the flags the exporter runs with.")
    _common_flags(doctor)
    doctor.add_argument("--web.config.file", dest="web_config", type=Path, metavar="FILE",
                        help="exporter-toolkit web config to check")
    rules = sub.add_parser("rules", help="the Prometheus/vmalert rule pack",
                           description="The Prometheus/vmalert rule pack (docs/rules.md).")
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="COMMAND", required=True)
    render = rules_sub.add_parser("render", help="write the rule files from the spec",
                                  description="Write the rule files, rendered from the shipped spec "
                                  "with your overrides merged over it.")
    render.add_argument("--spec", type=Path, metavar="FILE",
                        help="YAML overriding keys of the shipped spec (see rules/spec.yaml)")
    render.add_argument("--target", choices=TARGETS, default="prometheus",
                        help="prometheus, or vmalert (leaves out what vmalert 1.79 rejects) (default: prometheus)")
    render.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                        help="directory to write the rule files to (default: .)")
    render.add_argument("--tier", choices=TIERS, default="all",
                        help="all: one server's pack; local: the rules of one node's series, for each "
                             "server scraping a shard; fleet: the rules that compare nodes, on the server "
                             "that receives the local tiers' recordings (docs/scaling.md) (default: all)")
    boards = sub.add_parser("dashboards", help="the Grafana dashboards",
                            description="The Grafana dashboards (docs/dashboards.md).")
    boards_sub = boards.add_subparsers(dest="dashboards_command", metavar="COMMAND", required=True)
    render = boards_sub.add_parser("render", help="write the dashboards' JSON from the spec",
                                   description="Write the Grafana dashboards, with the selectors, labels and "
                                   "windows of the rule pack's spec (your overrides merged over it).")
    render.add_argument("--spec", type=Path, metavar="FILE",
                        help="YAML overriding keys of the shipped spec (see rules/spec.yaml)")
    render.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                        help="directory to write the dashboards to (default: .)")
    report = sub.add_parser("report", help="the fleet's operational report over a range, from its Prometheus",
                            description="Where the GPU-hours went (goodput per job and each loss named), failures "
                            "and the measured MTBF, checkpoint cost against the Young/Daly optimum, storage during "
                            "saves and loads, stragglers: read from any Prometheus-compatible query API, written as "
                            "DIR/report.md with its figures (PNG) and DIR/report.json (docs/report.md).")
    report.add_argument("--prometheus.url", dest="prometheus_url", required=True, metavar="URL",
                        help="the query API's base URL (Prometheus, VictoriaMetrics, Thanos, Mimir), "
                             "e.g. http://prometheus:9090")
    report.add_argument("--from", dest="since", default="-7d", metavar="TIME",
                        help="start: RFC 3339 (2026-11-21T00:00:00Z), now, or relative (-7d, -36h) (default: -7d)")
    report.add_argument("--to", dest="until", default="now", metavar="TIME", help="end, as --from (default: now)")
    report.add_argument("--output", type=Path, required=True, metavar="DIR", help="directory to write the report to")
    report.add_argument("--spec", type=Path, metavar="FILE",
                        help="the rule pack's spec overrides, for your selectors, labels and thresholds")
    return parser


def enabled_collectors(args: argparse.Namespace) -> list[str]:
    """The names of the collectors the flags enable."""
    def wanted(name: str, cls: type[Collector]) -> bool:
        chosen = getattr(args, f"collector_{name}")
        return chosen if chosen is not None else cls.default_enabled and not args.disable_defaults
    return [name for name, cls in sorted(COLLECTORS.items()) if wanted(name, cls)]


def _enabled(args: argparse.Namespace, ctx: Context) -> list[Collector]:
    return [COLLECTORS[name](ctx) for name in enabled_collectors(args)]


def context(args: argparse.Namespace, cfg: config.Config) -> Context:
    lookup = (CachedLookup(route_device, cfg.nfs.route_cache_seconds)
              if cfg.nfs.resolve_devices else (lambda _address: None))
    return Context(procfs=args.procfs, sysfs=args.sysfs, config=cfg, route_lookup=lookup, kmsg=args.kmsg,
                   state_dir=args.state_dir, persist_state=args.command == "serve")


def parse_args(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line as main() reads it: without a command, `serve`."""
    if not argv or (argv[0] not in COMMANDS and argv[0] != "--version"):
        argv = ["serve", *argv]
    parser = build_parser()
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command in ("rules", "dashboards"):
        return _render(args, parser)
    if args.command == "report":
        try:
            from exporter import report  # numpy and matplotlib: only here
        except ImportError:
            sys.stderr.write(f"{PROG} report: error: the report needs numpy and matplotlib: "
                             "pip install 'gpunode-exporter[report]'\n")
            return 2
        try:
            for path in report.run(args.prometheus_url, args.since, args.until, args.output, args.spec):
                print(path)
        except report.ReportError as err:
            sys.stderr.write(f"{PROG} report: error: {err}\n")
            return 2
        return 0
    # A mount point that is not there is a typo in the unit or the pod spec, not a node without
    # those files: refused like a broken --config.file, not served (or checked) as a node without
    # GPUs or mounts.
    for flag, path in (("--path.procfs", args.procfs), ("--path.sysfs", args.sysfs)):
        if not path.is_dir():
            parser.error(f"{flag} {path}: no such directory")
    if args.command == "doctor":
        from exporter import doctor  # reports bad config files itself, as findings

        return doctor.run(args)
    logs.setup(args.log_level)
    try:
        cfg = config.load(args.config_file)
        web = webconfig.load(args.web_config) if args.command == "serve" else None
        scenario = None
        if args.nvml_simulate:
            from exporter import nvmlsim  # a node that serves real GPUs never loads it

            scenario = nvmlsim.load(args.nvml_simulate)
    except config.ConfigError as err:
        parser.error(str(err))
    if scenario is not None:
        nvmlsim.install(scenario)  # imported above
        logging.getLogger(PROG).warning("NVML is SIMULATED from %s: GPU metrics are not real", args.nvml_simulate)
    renderer = Renderer()

    def make_scraper() -> Scraper:
        return Scraper(_enabled(args, context(args, cfg)), cfg.collector_timeout_seconds,
                       simulated=scenario is not None)

    if args.command == "dump":
        scraper = make_scraper()
        for chunk in renderer.chunks(scraper.collect()):
            sys.stdout.buffer.write(chunk)
        stuck = scraper.still_running()
        scraper.close()
        if stuck:  # their threads cannot be stopped, and Python would wait for them at exit
            logging.getLogger(PROG).error("collectors %s did not finish within %gs; exiting without them",
                                          ", ".join(stuck), cfg.collector_timeout_seconds)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0

    def render() -> Iterator[bytes]:
        yield from renderer.chunks(scraper.collect())
        yield from renderer.chunks(process.collect())  # the exporter's own memory, CPU, fds
        process.release_memory()

    # Listen first: an exporter that cannot listen starts no collector (no Xid state is touched).
    server = _listen(args, render, web)
    if server is None:
        return 1
    scraper = make_scraper()
    try:
        _serve(server)
    finally:
        scraper.close()  # stops the Xid reader and saves its state
    return 0


def _render(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`rules render` and `dashboards render`: files from the spec, written to --out."""
    # Here, not at the top: `serve` needs neither jinja2 nor Grafana's SDK (memory, start time).
    from exporter import dashboards, rulepack
    from exporter.rulepack import check
    try:
        spec = rulepack.load_spec(args.spec)
        check.check_spec(spec)
        if args.command == "rules":
            from exporter.rulepack import tiers

            rendered = rulepack.render(spec, args.target)
            check.check_rules(spec, rendered)
            files = tiers.split(rendered, args.tier, spec["labels"]["node"])
        else:
            files = check.checked(spec, lambda: dashboards.files(spec))
    except config.ConfigError as err:
        parser.error(str(err))
    try:
        rulepack.write(files, args.out)
    except OSError as err:
        sys.stderr.write(f"{PROG}: error: cannot write {args.out}: {err.strerror}\n")
        return 1
    # One write: a reader that stops early (`| head`) has the whole list in the pipe, not a broken one.
    sys.stdout.write("".join(f"{args.out / name}\n" for name in files))
    if args.command == "rules" and spec["runbook_base_url"] != rulepack.shipped_spec()["runbook_base_url"]:
        sys.stderr.write(f"{PROG}: warning: alerts link to {spec['runbook_base_url']}/AREA.md#alertname: keep a "
                         "copy of docs/runbooks/ there, its file names and headings as they are, or the links "
                         "are dead (docs/rules.md)\n")
    return 0


def _listen(args: argparse.Namespace, render: Callable[[], Iterator[bytes]],
            web: webconfig.WebConfig) -> ThreadingHTTPServer | None:
    handler = make_handler(render, web, args.telemetry_path, args.max_requests)
    try:
        server = make_server(args.listen, handler, web)
    except OSError as err:
        sys.stderr.write(f"{PROG}: error: cannot listen on {args.listen}: {err.strerror}\n")
        return None
    logging.getLogger(PROG).info("listening on %s%s (%s)", args.listen, args.telemetry_path,
                                 "TLS" if web.ssl_context else "plain HTTP")
    return server


def _serve(server: ThreadingHTTPServer) -> None:
    log = logging.getLogger(PROG)

    def _shutdown(signum: int, _frame: object) -> None:
        log.info("received signal %d, shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    server.serve_forever()
    server.server_close()
