"""Minimal Debian systems for the system tests: built with mmdebstrap, run with systemd-nspawn.

A rootfs is cached as a tarball under CACHE, keyed by what it includes, and unpacked afresh for
each test: a test may break its copy, never the next test's. `boot()` boots one (systemd as its
PID 1) for as long as a block runs. Root only (mmdebstrap's root mode, nspawn);
`skip_unless_ready()` says why not elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CACHE = Path("/var/cache/gpunode-exporter-tests")
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
# The machine's CA bundle, for pip inside: where a proxy re-signs TLS, PyPI's certificate chains to it.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CA_INSIDE = "/host-ca.crt"  # not /etc/ssl/certs: ca-certificates rewrites its own bundle when installed
TOOLS = {"mmdebstrap": "mmdebstrap", "systemd-nspawn": "systemd-container"}


def skip_unless_ready(*tools: str) -> None:
    """Skips, with the reason, unless root has mmdebstrap, systemd-nspawn and `tools`."""
    if os.geteuid() != 0:
        pytest.skip("system tests build and boot a Debian rootfs: need root")
    missing = [name for name in [*TOOLS, *tools] if shutil.which(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/install-deps.sh --test installs them)")


def build(include: list[str], variant: str = "minbase") -> Path:
    """The cached tarball of a `variant` Debian with `include`; built once (~15 s) when missing."""
    key = hashlib.sha256(f"{SUITE} {variant} {sorted(include)}".encode()).hexdigest()[:12]
    return _mmdebstrap(CACHE / f"{SUITE}-{variant}-{key}.tar", include, variant)


def _mmdebstrap(tarball: Path, include: list[str], variant: str, options: tuple[str, ...] = ()) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    # One build of a tarball at a time, across test processes: a second waits and finds it made.
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            partial = tarball.with_suffix(".partial.tar")
            subprocess.run(["mmdebstrap", "--quiet", f"--variant={variant}", f"--include={','.join(include)}",
                            *options, "--mode=root", "--format=tar", SUITE, str(partial), MIRROR],
                           check=True, capture_output=True, timeout=600)
            partial.rename(tarball)  # whole or not at all: an interrupted build is not a cache entry
    return tarball


def unpack(tarball: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(into)], check=True, timeout=300)
    return into


def nspawn_runtime_dir() -> None:
    """nspawn keeps its state under /run/systemd/nspawn and wants a tmpfs there; /run is not one
    on every machine (a container's, a CI runner's)."""
    path = Path("/run/systemd/nspawn")
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(path)]).returncode != 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(path)], check=True)


def nspawn(root: Path, *argv: str, options: tuple[str, ...] = (), timeout: float = 600,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """argv inside `root` (not booted), sharing the host's network, with the host's CA bundle."""
    nspawn_runtime_dir()
    ca = HOST_CA.is_file()
    environment = {**({"PIP_CERT": CA_INSIDE} if ca else {}), "DEBIAN_FRONTEND": "noninteractive", **(env or {})}
    command = ["systemd-nspawn", "--quiet", f"--directory={root}", "--register=no", "--keep-unit",
               "--timezone=off", *([f"--bind-ro={HOST_CA}:{CA_INSIDE}"] if ca else []),
               *(f"--setenv={k}={v}" for k, v in environment.items()), *options, *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def build_customized(include: list[str], hooks: list[str], variant: str = "minbase",
                     inputs: tuple[Path, ...] = ()) -> Path:
    """build(), then mmdebstrap's --customize-hook commands (`$1` is the rootfs): the cached tarball,
    keyed by the hooks too and by the contents of `inputs`, the host files they copy in."""
    digests = [hashlib.sha256(path.read_bytes()).hexdigest() for path in inputs]
    key = hashlib.sha256(f"{SUITE} {variant} {sorted(include)} {hooks} {digests}".encode()).hexdigest()[:12]
    return _mmdebstrap(CACHE / f"{SUITE}-{variant}-custom-{key}.tar", include, variant,
                       tuple(f"--customize-hook={hook}" for hook in hooks))


# --- booted systems ---------------------------------------------------------------------------

INSIDE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Booted:
    """A system started by boot(). Commands run in it through nsenter: in all its namespaces, with
    its root, as root, and with an environment of their own (nothing of the host's leaks in)."""

    def __init__(self, process: subprocess.Popen[bytes], leader: int) -> None:
        self.process = process  # systemd-nspawn
        self.leader = leader  # the container's PID 1, as the host numbers it

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", f"--target={self.leader}", "--all", "env", "-i", f"PATH={INSIDE_PATH}",
                               *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    def wait_running(self, timeout: float = 120) -> str:
        """`systemctl is-system-running --wait` once the manager answers: running, degraded, ..."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                state = self.run("systemctl", "is-system-running", "--wait", timeout=max(left, 1)).stdout.strip()
            except subprocess.TimeoutExpired:
                state = "starting"
            if state not in ("", "offline", "unknown", "initializing", "starting") or left <= 0:
                return state
            time.sleep(0.2)  # not listening yet: the manager is still setting up


def _container_leader(nspawn: subprocess.Popen[bytes], timeout: float) -> int | None:
    """nspawn's child that is PID 1 of a PID namespace of its own and has exec'd init, or None."""
    deadline = time.monotonic() + timeout
    own_exe = os.path.realpath(shutil.which("systemd-nspawn") or "systemd-nspawn")  # until the child execs init
    while time.monotonic() < deadline and nspawn.poll() is None:
        for pid in (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
            try:
                status = dict(line.partition(":\t")[::2] for line in _lines(f"/proc/{pid}/status"))
                if (status["PPid"] == str(nspawn.pid) and status["NSpid"].split()[1:] == ["1"]
                        and os.readlink(f"/proc/{pid}/exe") != own_exe):
                    return pid
            except (OSError, KeyError):
                continue  # gone meanwhile, or a kernel thread
        time.sleep(0.1)
    return None


def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


@contextlib.contextmanager
def boot(root: Path, options: tuple[str, ...] = (), console: Path | None = None,
         timeout: float = 60) -> Iterator[Booted]:
    """`root` booted with systemd-nspawn -b (sharing the host's network, not registered with a
    host systemd), its console written to `console`. On leaving, whatever happened inside, it is
    powered off, and killed when that takes more than `timeout`: no container outlives the block."""
    nspawn_runtime_dir()
    with contextlib.ExitStack() as files:
        out = files.enter_context(console.open("wb")) if console is not None else subprocess.DEVNULL
        process = subprocess.Popen(["systemd-nspawn", "--boot", f"--directory={root}", "--register=no",
                                    "--keep-unit", "--timezone=off", "--link-journal=no", *options],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        leader = None
        try:
            leader = _container_leader(process, timeout)
            if leader is None:
                raise RuntimeError(f"systemd-nspawn started no init in {timeout} s (console: {console})")
            yield Booted(process, leader)
        finally:
            _power_off(process, leader, timeout)


def _power_off(process: subprocess.Popen[bytes], leader: int | None, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        if leader is not None and process.poll() is None:
            os.kill(leader, signal.SIGRTMIN + 4)  # systemd's poweroff
        else:
            process.terminate()  # nspawn passes it on to the container as its kill signal
    try:
        process.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            if leader is not None:
                os.kill(leader, signal.SIGKILL)  # PID 1 of the namespace: every process in it dies
    try:
        process.wait(10)  # nspawn reaps the container and exits
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
