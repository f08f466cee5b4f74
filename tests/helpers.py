"""Small shared test helpers."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunode_common.exposition import Renderer
from gpunode_common.http import free_port  # noqa: F401  (tests take it from here; one copy of it)
from gpunode_exporter import nvmlsim
from gpunode_exporter.collector.base import Collector, Context, Family
from gpunode_exporter.config import Config, NFSConfig
from gpunode_exporter.nvmlsim.library import FUNCTIONS, SimulatedNVML
from gpunode_exporter.nvmlsim.scenario import build

Series = dict[str, dict[tuple, float]]

ROOT = Path(__file__).resolve().parent.parent
# Each package's import name and its folder (pyproject.toml's package-dir): gpunode_exporter is exporter/.
FOLDERS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


# What a minimal Debian has (its Essential and required packages: bash, coreutils, grep, dpkg,
# util-linux, mount) with the git, make and python3 a checkout needs (tests/test_bare_debian.py
# holds it in one that mmdebstrap makes).
MINIMAL_DEBIAN = {"bash", "sh", "df", "dd", "sleep", "kill", "mktemp", "head", "grep", "dpkg-query", "mount", "umount",
                  "unshare", "setpriv", "nsenter", "mountpoint", "tar", "git", "make", "python3"}


def install_deps_tools() -> dict[str, str]:
    """scripts/install-deps.sh's {command: the Debian package that brings it}, every mode's."""
    text = (ROOT / "scripts" / "install-deps.sh").read_text()
    lists = re.findall(r'^[a-z]+_tools="([^"]*)"', text, re.MULTILINE)
    assert len(lists) == 3, "install-deps.sh no longer says what it installs as node_, demo_ and test_tools"
    return dict(pair.split(":") for pair in " ".join(lists).split())


def copy_tracked_files(dest: Path) -> Path:
    """The checkout's tracked files (as a clone holds them, uncommitted edits included) into dest;
    symlinks stay links (the sysfs fixtures are made of them)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file() or source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


def build_wheel(scratch: Path, wheels: Path, with_dependencies: bool = False) -> Path:
    """The project's wheel (with its dependencies' wheels, if asked) in `wheels`, built from a copy of
    the checkout in `scratch`: setuptools builds in the source tree's build/, which two builds at once
    (tests side by side) would share."""
    source = copy_tracked_files(scratch)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", *([] if with_dependencies else ["--no-deps"]),
                           "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = wheels.glob("gpunode_exporter-*.whl")
    return wheel


@dataclass(frozen=True)
class Install:
    tree: Path  # a clean copy of the checkout
    venv: Path  # its virtualenv, holding what one make target installs and nothing more

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A command of the virtualenv's bin/ (python, gpunode-exporter, ...), run in the copy."""
        return subprocess.run([str(self.venv / "bin" / args[0]), *args[1:]], cwd=self.tree, capture_output=True,
                              text=True, timeout=timeout, env=outside_any_venv())


def outside_any_venv() -> dict[str, str]:
    """This environment as a new shell has it: no virtualenv active, nothing on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(sys.prefix) not in Path(p).parents)
    return env


def fresh_install(dest: Path, target: str) -> Install:
    """A clean copy of the checkout in dest, and the install step of `make TARGET` run in it as the
    Makefile says (`make -n`): a newcomer's fresh clone, with nothing more than that target installs."""
    tree = copy_tracked_files(dest / "checkout")
    recipe = subprocess.run(["make", "-n", target], cwd=tree, capture_output=True, text=True, check=True).stdout
    steps = [line for line in recipe.splitlines() if line.startswith("scripts/install-deps.sh")]
    assert steps, f"make {target} installs nothing with scripts/install-deps.sh:\n{recipe}"
    for step in steps:
        done = subprocess.run(["bash", "-c", step], cwd=tree, capture_output=True, text=True, timeout=900,
                              env=outside_any_venv())
        assert done.returncode == 0, f"{step}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return Install(tree, tree / ".venv")


def skip_without_kmsg() -> None:
    """A container (systemd-nspawn's default devices) may have no /dev/kmsg, or one nobody may read:
    then a test of reading the kernel log has nothing to read."""
    try:
        with open("/dev/kmsg", "rb", buffering=0):
            pass
    except OSError as err:
        pytest.skip(f"/dev/kmsg cannot be read here ({err.strerror}): no kernel log to test against")


def skip_without_fleet_tools() -> None:
    """A fleet run needs Prometheus, promtool and VictoriaMetrics on the PATH."""
    from fleet import harness  # numpy and the rule pack: paid for by the fleet's tests alone

    if tools := harness.missing_tools():
        pytest.skip(f"not installed: {', '.join(tools)} (scripts/install-deps.sh --test installs them)")


def skip_unless_nobody_can_run_the_checkout() -> None:
    """A test that drops to nobody needs root, setpriv, and a checkout and venv nobody can read: a
    checkout under /root (mode 0700) is not one, and the test cannot say anything there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    if shutil.which("setpriv") is None:
        pytest.skip("util-linux's setpriv is not installed")
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import gpunode_exporter, yaml"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"nobody cannot run {sys.executable} in {ROOT} (a parent directory of mode 0700?): {reason}")


def nfs_context(procfs: Path, route_lookup: Callable[[str], str | None] = lambda _a: None,
                every_series: bool = False) -> Context:
    """every_series: every operation and transport series, each transport on its own
    (nfs.operations and transport_series: all, per_transport: true)."""
    config = (Config(nfs=NFSConfig(operations=("all",), transport_series=("all",), per_transport=True))
              if every_series else Config())
    return Context(procfs=procfs, sysfs=procfs.parent / "sys", config=config, route_lookup=route_lookup)


def parse_exposition(text: str) -> Series:
    """{sample name: {sorted label items: value}}."""
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return series


def render(families: Iterable[Family]) -> str:
    return Renderer().render(families).decode()


def collect_samples(collector: Collector) -> Series:
    """One collect() call, rendered and parsed back as Prometheus would."""
    return parse_exposition(render(collector.collect()))


def serve_text(body: Callable[[str], str], host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A server, already serving on a thread of its own, answering each GET with body(path) as an
    exporter serves its metrics; the caller shuts it down."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = body(self.path).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_for_port(port: int, alive: Callable[[], bool] = lambda: True, seconds: float = 20) -> None:
    """Until something accepts on 127.0.0.1:port; fails early if `alive()` turns false."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError("the server exited before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {seconds}s")


class SimClock:
    """Simulated seconds since start, set by the test."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def simulated_nvml(scenario: dict[str, Any] | Path, clock: Callable[[], float] | None = None,
                   ) -> Iterator[SimulatedNVML]:
    """pynvml talks to a simulated driver inside the block (scenario as data or a file)."""
    node = nvmlsim.load(scenario) if isinstance(scenario, Path) else build(scenario, FUNCTIONS)
    try:
        yield nvmlsim.install(node, clock)
    finally:
        nvmlsim.uninstall()


def parse_ethtool_s(text: str) -> dict[str, int]:
    """`ethtool -S` text -> {name: value}, in order. ethtool prints "     %s: %llu"; a name
    may contain ": " itself (bnx2x's "[0]: rx_bytes"), so the value follows the last one."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("     "):
            continue  # "NIC statistics:", blank lines
        name, _, value = line[5:].rpartition(": ")
        stats[name] = int(value)
    return stats


def ethtool_fixture(name: str) -> dict[str, int]:
    """A driver's statistics from tests/fixtures/ethtool/NAME."""
    return parse_ethtool_s((Path(__file__).parent / "fixtures" / "ethtool" / name).read_text())


def add_device_links(sysfs: Path) -> None:
    """The `device` links of class/net and class/infiniband entries back to their PCI function, as
    the kernel spells them (../../../0000:18:00.0). The committed fixture leaves them out: see
    tests/fixtures/sysfs/make_sysfs.py write_nic()."""
    for cls in ("net", "infiniband"):
        links = sysfs / "class" / cls
        for entry in sorted(links.iterdir()) if links.is_dir() else []:
            target = Path(os.path.realpath(entry))
            function = target.parent.parent
            if not (target / "device").is_symlink():
                (target / "device").symlink_to(f"{os.path.relpath(function.parent, target)}/{function.name}")
