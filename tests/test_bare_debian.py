"""A fresh machine as README.md means it: a minimal Debian (mmdebstrap's, with git, make and
python3 alone) set up by scripts/install-deps.sh, as `make demo` and `make test` run it first.
Afterwards the venv works and every program the demo, the tests and the documented commands call
is there, by name. A step of the script that goes missing (python3-venv, curl) fails here."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import rootfs
from tests.helpers import MINIMAL_DEBIAN, copy_tracked_files, install_deps_tools

# Debian rootfs under systemd-nspawn: one at a time (the rootfs cache, nspawn's runtime directory).
pytestmark = pytest.mark.xdist_group("nspawn")

CHECKOUT = "/src/gpunode-exporter"  # inside
DEMO_TOOLS = {"ip", "prometheus", "prometheus-node-exporter", "prometheus-alertmanager", "curl"}


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bare rootfs with a copy of the checkout's tracked files (as a clone of it would hold)."""
    rootfs.skip_unless_ready()
    root = rootfs.unpack(rootfs.build(["git", "make", "python3"]), tmp_path_factory.mktemp("bare") / "root")
    copy_tracked_files(root / CHECKOUT.lstrip("/"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def inside(root: Path, script: str) -> subprocess.CompletedProcess[str]:
    return rootfs.nspawn(root, "bash", "-c", script, options=(f"--chdir={CHECKOUT}",))


def missing(root: Path, programs: set[str]) -> list[str]:
    # As root's PATH inside has it: /usr/sbin included.
    out = inside(root, "for p in " + " ".join(map(shlex.quote, sorted(programs))) +
                 "; do command -v \"$p\" >/dev/null || echo \"$p\"; done")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_minimal_debian_has_what_the_tests_take_for_granted(machine: Path) -> None:
    assert missing(machine, MINIMAL_DEBIAN) == []


def test_install_deps_for_the_demo(machine: Path) -> None:
    done = inside(machine, "scripts/install-deps.sh --demo")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "python3-venv" in done.stdout + done.stderr  # the step a bare Debian needs first (nspawn: one stream)
    assert missing(machine, DEMO_TOOLS) == []
    version = inside(machine, ".venv/bin/gpunode-exporter --version && .venv/bin/python -c 'import requests'")
    assert version.returncode == 0 and version.stdout.startswith("gpunode-exporter "), version.stderr


def test_install_deps_for_the_tests(machine: Path) -> None:
    done = inside(machine, "scripts/install-deps.sh --test")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert missing(machine, set(install_deps_tools())) == []
    imports = inside(machine,
                     ".venv/bin/python -c 'import gpunode_exporter, pytest, prometheus_client, hypothesis, pyroute2'")
    assert imports.returncode == 0, imports.stderr
    # A documented command, as README.md gives it for any Linux machine.
    dump = inside(machine, '.venv/bin/gpunode-exporter dump --path.state "$(mktemp -d)" '
                           "| grep -E '^gpunode_scrape_collector_success'")
    assert dump.returncode == 0 and 'collector="nfs"} 1' in dump.stdout, dump.stdout + dump.stderr
