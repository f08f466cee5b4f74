"""What the command lines of gpunode-exporter and gpunode-remediate share: an error is one line
naming the program (exit 2), a flag is spelled in full (as node_exporter refuses one it does not
know, a typo in a unit file fails rather than matching another flag), and a listen address is
read as node_exporter reads it."""

from __future__ import annotations

import argparse
import sys

from gpunode_common.http import parse_listen_address


class Parser(argparse.ArgumentParser):
    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog.split()[0]}: error: {message}\n")
        sys.exit(2)


def listen_address(value: str) -> str:
    try:
        parse_listen_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value
