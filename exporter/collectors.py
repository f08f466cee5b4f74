"""The collectors a command line enables, and the context they read the node through: what `serve`,
`dump` and `doctor` share."""

from __future__ import annotations

import argparse

from gpunode_exporter import config
from gpunode_exporter.collector import COLLECTORS, Collector, Context
from gpunode_exporter.netroute import CachedLookup, route_device


def enabled_collectors(args: argparse.Namespace) -> list[str]:
    """The names of the collectors the flags enable."""
    def wanted(name: str, cls: type[Collector]) -> bool:
        chosen = getattr(args, f"collector_{name}")
        return chosen if chosen is not None else cls.default_enabled and not args.disable_defaults
    return [name for name, cls in sorted(COLLECTORS.items()) if wanted(name, cls)]


def enabled(args: argparse.Namespace, ctx: Context) -> list[Collector]:
    return [COLLECTORS[name](ctx) for name in enabled_collectors(args)]


def context(args: argparse.Namespace, cfg: config.Config) -> Context:
    lookup = (CachedLookup(route_device, cfg.nfs.route_cache_seconds)
              if cfg.nfs.resolve_devices else (lambda _address: None))
    return Context(procfs=args.procfs, sysfs=args.sysfs, config=cfg, route_lookup=lookup, kmsg=args.kmsg,
                   state_dir=args.state_dir, persist_state=args.command == "serve")
