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
from types import ModuleType

from gpunode_common import __version__, logs, webconfig
from gpunode_common.exposition import Renderer
from gpunode_common.flags import Parser, listen_address
from gpunode_common.http import ThreadingHTTPServer, make_handler, make_server
from gpunode_exporter import collectors, config, process
from gpunode_exporter.collector import COLLECTORS
from gpunode_exporter.scrape import Scraper

PROG = "gpunode-exporter"
DEFAULT_LISTEN = ":19835"
COMMANDS = ("serve", "dump", "doctor", "rules", "dashboards", "report")
DISPATCHED = ("rules", "dashboards", "report")  # other programs' commands: dispatched, not parsed here


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
    # Each of these is another program's: its flags and its code are in its own package.
    sub.add_parser("rules", help="the Prometheus/vmalert rule pack (rulepack/)", add_help=False)
    sub.add_parser("dashboards", help="the Grafana dashboards (rulepack/dashboards/)", add_help=False)
    sub.add_parser("report", help="the fleet's operational report over a range, from its Prometheus (report/)",
                   add_help=False)
    return parser


def other_program(command: str) -> ModuleType:
    """The command line of the program that runs a dispatched command, imported only for it: a node
    that serves metrics never loads the rule pack, the dashboards or the report."""
    if command == "report":
        from gpunode_report import cli
    else:
        from gpunode_rulepack import cli
    return cli


def parse_args(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line as main() reads it: without a command, `serve`."""
    if argv and argv[0] in DISPATCHED:
        parser = other_program(argv[0]).build_parser(argv[0])
        return parser, parser.parse_args(argv[1:])
    if not argv or (argv[0] not in COMMANDS and argv[0] != "--version"):
        argv = ["serve", *argv]
    parser = build_parser()
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DISPATCHED:
        return other_program(argv[0]).main(argv)
    parser, args = parse_args(argv)
    # A mount point that is not there is a typo in the unit or the pod spec, not a node without
    # those files: refused like a broken --config.file, not served (or checked) as a node without
    # GPUs or mounts.
    for flag, path in (("--path.procfs", args.procfs), ("--path.sysfs", args.sysfs)):
        if not path.is_dir():
            parser.error(f"{flag} {path}: no such directory")
    if args.command == "doctor":
        from gpunode_exporter import doctor  # reports bad config files itself, as findings

        return doctor.run(args)
    logs.setup(args.log_level)
    try:
        cfg = config.load(args.config_file)
        web = webconfig.load(args.web_config) if args.command == "serve" else None
        scenario = None
        if args.nvml_simulate:
            from gpunode_exporter import nvmlsim  # a node that serves real GPUs never loads it

            scenario = nvmlsim.load(args.nvml_simulate)
    except config.ConfigError as err:
        parser.error(str(err))
    if scenario is not None:
        nvmlsim.install(scenario)  # imported above
        logging.getLogger(PROG).warning("NVML is SIMULATED from %s: GPU metrics are not real", args.nvml_simulate)
    renderer = Renderer()

    def make_scraper() -> Scraper:
        return Scraper(collectors.enabled(args, collectors.context(args, cfg)), cfg.collector_timeout_seconds,
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
