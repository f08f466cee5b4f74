"""Minimal Debian systems for the system tests: built with mmdebstrap, run with systemd-nspawn.

A rootfs is cached as a tarball under CACHE, keyed by what it includes, and unpacked afresh for
each test: a test may break its copy, never the next test's. Root only (mmdebstrap's root mode,
nspawn); `skip_unless_ready()` says why not elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
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
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
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
