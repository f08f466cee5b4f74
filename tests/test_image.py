"""deploy/Containerfile built with podman as written, and the image run as
deploy/kubernetes/daemonset.yaml runs it: the manifest's arguments, environment, mounts,
capabilities, read-only root and host network, read from the manifest.

Nothing can be pulled here, so the base image the Containerfile names is a Debian bookworm
built with mmdebstrap (tests/rootfs.py) and made to behave as the official image does where the
Containerfile relies on it, then imported under the name its FROM lines give. Podman keeps its
images in a store of the tests' own (STORE), apart from the machine's: the base image stays
there between runs, the built image does not. Root only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpunode_exporter import cli, collectors
from tests import rootfs
from tests.helpers import free_port, parse_exposition, wait_for_port

# Debian rootfs under systemd-nspawn: one at a time (the rootfs cache, nspawn's runtime directory).
pytestmark = pytest.mark.xdist_group("nspawn")

ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
MANIFEST = ROOT / "deploy" / "kubernetes" / "daemonset.yaml"
STORE = rootfs.CACHE / "podman"
SOURCE_LABEL = "gpunode-exporter-tests.rootfs"  # on the base image: the tarball it was imported from
TEST_IMAGE = "localhost/gpunode-exporter-test"
# What the official python image gives that the Containerfile uses: pip on PATH, `pip install` into
# the system Python (no PEP 668 marker), console scripts in /usr/local/bin. Debian's pip trusts the
# system CA bundle: the host's where it has one, so that PyPI is reached where a proxy re-signs TLS.
BASE_PACKAGES = ["python3-pip"]
BASE_HOOKS = ['rm -f "$1/usr/lib/python3.11/EXTERNALLY-MANAGED"',
              f'[ ! -f {rootfs.HOST_CA} ] || cp -L {rootfs.HOST_CA} "$1/etc/ssl/certs/ca-certificates.crt"']
BASE_CHANGES = ["ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "ENV=LANG=C.UTF-8",
                'CMD=["python3"]']


@dataclass(frozen=True)
class Podman:
    """podman on the tests' own store, with the engine settings of containers.conf at `conf`."""

    options: tuple[str, ...]
    conf: Path

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *self.options, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "CONTAINERS_CONF": str(self.conf)})
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
        return done


def _manifest() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def _pod_spec() -> dict[str, Any]:
    (ds,) = [d for d in _manifest() if d["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def _base_image_names(containerfile: str) -> list[str]:
    """The images the FROM lines name, not the earlier stages they may name instead."""
    names: list[str] = []
    stages: set[str] = set()
    for image, stage in re.findall(r"^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", containerfile,
                                   re.MULTILINE | re.IGNORECASE):
        if image not in stages and image not in names:
            names.append(image)
        stages.add(stage)
    return names


def _overlay_works(where: Path) -> bool:
    """Whether the kernel mounts an overlay whose upper layer is on `where`'s filesystem (not on
    overlayfs itself, nor where mounting is not allowed)."""
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where) as probe:
        dirs = {name: Path(probe, name) for name in ("lower", "upper", "work", "merged")}
        for path in dirs.values():
            path.mkdir()
        options = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(dirs["merged"])],
                                 capture_output=True).returncode == 0
        if mounted:
            subprocess.run(["umount", str(dirs["merged"])], check=True)
        return mounted


def _ulimits() -> list[str]:
    """Podman's defaults for a container (nofile and nproc 1048576) may be above the hard limits it
    runs under, and without CAP_SYS_RESOURCE runc cannot raise them: this process's hard limits, and
    nproc no higher than pid_max, to which podman lowers its own."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], int(Path("/proc/sys/kernel/pid_max").read_text()))
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def _containers_conf(path: Path) -> Path:
    """runc: crun refuses hybrid cgroups. cgroupfs and a file for events: systemd may not be running."""
    path.write_text(f"[containers]\ndefault_ulimits = {json.dumps(_ulimits())}\n"
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    return path


def _locked(path: Path) -> int:
    """One test run on the store at a time: each starts by resetting what the last one left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _remove_leftovers(podman: Podman) -> None:
    """Containers and images an interrupted run left (the base image stays)."""
    leftover = podman("ps", "--all", "--external", "--quiet").stdout.split()
    if leftover:
        podman("rm", "--force", "--storage", *leftover)
    tags = podman("images", "--noheading", "--format", "{{.Repository}}:{{.Tag}}", TEST_IMAGE).stdout.split()
    if tags:
        podman("rmi", "--force", *tags)
    podman("image", "prune", "--force")


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    if os.geteuid() != 0:
        pytest.skip("builds a Debian rootfs and runs podman as root: need root")
    rootfs.skip_unless_ready("podman", "runc")
    driver = "overlay" if _overlay_works(STORE) else "vfs"  # vfs copies each layer whole: slower, works anywhere
    graphroot = STORE / driver
    lock = _locked(STORE / f"{driver}.lock")
    try:
        # The runtime state is new each run; podman's container database under the store records the
        # runroot it was made with and refuses another, and holds nothing this test keeps.
        shutil.rmtree(graphroot / "libpod", ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="gpunode-podman-") as run:
            podman = Podman(("--root", str(graphroot), "--runroot", f"{run}/storage", "--tmpdir", f"{run}/libpod",
                             "--storage-driver", driver), _containers_conf(Path(run, "containers.conf")))
            _remove_leftovers(podman)
            yield podman
    finally:
        os.close(lock)


def _ensure_base_image(podman: Podman, names: list[str]) -> None:
    """The rootfs imported under `names`, unless the store holds it from the same tarball already."""
    host_ca = (rootfs.HOST_CA,) if rootfs.HOST_CA.is_file() else ()
    tarball = rootfs.build_customized(BASE_PACKAGES, BASE_HOOKS, inputs=host_ca)
    stat = tarball.stat()
    source = f"{tarball.name}:{stat.st_size}:{stat.st_mtime_ns}"
    found = podman("image", "inspect", "--format", f'{{{{index .Labels "{SOURCE_LABEL}"}}}}', *names, check=False)
    if found.returncode == 0 and set(found.stdout.split()) == {source}:
        return
    podman("rmi", "--force", "--ignore", *names)
    changes = [*BASE_CHANGES, f"LABEL={SOURCE_LABEL}={source}"]
    podman("import", *(f"--change={change}" for change in changes), str(tarball), names[0], timeout=300)
    for name in names[1:]:
        podman("tag", names[0], name)


@pytest.fixture(scope="module")
def base_image(podman: Podman) -> list[str]:
    names = _base_image_names(CONTAINERFILE.read_text())
    _ensure_base_image(podman, names)
    return names


def _build(podman: Podman, context: Path, containerfile: Path, tag: str) -> subprocess.CompletedProcess[str]:
    """`podman build` as the Containerfile's comment says, from nothing cached but the base image.
    The host's network: the RUN steps' pip reaches PyPI as this machine does."""
    return podman("build", "--pull=never", "--no-cache", "--network=host", "-f", str(containerfile), "-t", tag,
                  str(context), timeout=600, check=False)


def _remove_image(podman: Podman, tag: str) -> None:
    podman("rmi", "--force", "--ignore", tag)
    podman("image", "prune", "--force")  # the first stage's images, which nothing tags


@pytest.fixture(scope="module")
def image(podman: Podman, base_image: list[str]) -> Iterator[str]:
    tag = f"{TEST_IMAGE}:{os.getpid()}"
    try:
        built = _build(podman, ROOT, CONTAINERFILE, tag)
        assert built.returncode == 0, f"podman build failed:\n{built.stdout}{built.stderr}"
        yield tag
    finally:
        _remove_image(podman, tag)


def _state_dir(tmp: Path) -> Path:
    return tmp / "hostpath-writable"


def _host_paths(pod: dict[str, Any], mounts: list[dict[str, Any]], tmp: Path) -> dict[str, Path]:
    """Each volume's path on this machine: a hostPath's own, except a writable one, which goes to a
    directory of the test's (the exporter's state is no business of this machine's /var/lib); a
    ConfigMap's data written to files, as the kubelet projects it."""
    writable = {m["name"] for m in mounts if not m.get("readOnly")}
    configmaps = {d["metadata"]["name"]: d["data"] for d in _manifest() if d["kind"] == "ConfigMap"}
    paths: dict[str, Path] = {}
    for volume in pod["volumes"]:
        name = volume["name"]
        if "hostPath" in volume and name in writable:
            paths[name] = _state_dir(tmp) / name
            paths[name].mkdir(parents=True)
        elif "hostPath" in volume:
            paths[name] = Path(volume["hostPath"]["path"])
        elif "configMap" in volume:
            paths[name] = tmp / "configmap" / name
            paths[name].mkdir(parents=True)
            for key, text in configmaps[volume["configMap"]["name"]].items():
                (paths[name] / key).write_text(text)
        else:
            pytest.fail(f"volume {name}: only hostPath and configMap volumes are run here")
    return paths


def _mount_options(pod: dict[str, Any], container: dict[str, Any], tmp: Path) -> list[str]:
    mounts = container["volumeMounts"]
    paths = _host_paths(pod, mounts, tmp)
    return [f"--volume={paths[m['name']]}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}" for m in mounts]


SECURITY_CONTEXT = {"runAsUser", "runAsGroup", "privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                    "capabilities"}


def _security_options(context: dict[str, Any]) -> list[str]:
    unknown = set(context) - SECURITY_CONTEXT
    assert not unknown, f"securityContext keys this test does not run: {unknown}"
    user = f"{context['runAsUser']}" + (f":{context['runAsGroup']}" if "runAsGroup" in context else "")
    options = [f"--user={user}"] if "runAsUser" in context else []
    options += ["--privileged"] if context.get("privileged") else []
    options += ["--security-opt=no-new-privileges"] if context.get("allowPrivilegeEscalation") is False else []
    # Kubernetes mounts no tmpfs on a read-only root; podman would, on /tmp, /var/tmp and /run.
    options += ["--read-only", "--read-only-tmpfs=false"] if context.get("readOnlyRootFilesystem") else []
    capabilities = context.get("capabilities", {})
    options += [f"--cap-drop={cap}" for cap in capabilities.get("drop", [])]
    return options + [f"--cap-add={cap}" for cap in capabilities.get("add", [])]


def _memory(quantity: str) -> str:
    """A Kubernetes memory quantity as podman's --memory takes it (binary suffixes only)."""
    number, suffix = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity).groups()
    return number + {"Ki": "k", "Mi": "m", "Gi": "g", None: "b"}[suffix]


def _pod_options(pod: dict[str, Any]) -> list[str]:
    if not pod.get("hostNetwork"):
        pytest.fail("the test reaches the exporter in the host's network, as hostNetwork: true gives it")
    return ["--network=host", *(["--pid=host"] if pod.get("hostPID") else []),
            *(["--ipc=host"] if pod.get("hostIPC") else [])]


@dataclass(frozen=True)
class Run:
    """`podman run` of the DaemonSet's container: options, arguments, and where its ports are."""

    options: list[str]
    args: list[str]
    ports: dict[str | int, int]  # a port's name and number in the manifest -> where it answers here


def _daemonset_run(tmp: Path) -> Run:
    pod = _pod_spec()
    (container,) = pod["containers"]
    args = list(container["args"])
    # The manifest's port may be taken on a shared machine (the docs' examples use it): the listen
    # address alone moves to a free port; the probes follow it.
    (i,) = [i for i, arg in enumerate(args) if arg.startswith("--web.listen-address=")]
    host, _, listen = args[i].partition("=")[2].rpartition(":")
    port = free_port()
    args[i] = f"--web.listen-address={host}:{port}"
    ports: dict[str | int, int] = {int(listen): port}
    ports |= {p["name"]: port for p in container["ports"] if p["containerPort"] == int(listen) and "name" in p}
    env = [f"--env={e['name']}={e['value']}" for e in container.get("env", [])]
    options = [*_pod_options(pod), *_security_options(container.get("securityContext", {})),
               *_mount_options(pod, container, tmp), *env]
    if "memory" in container.get("resources", {}).get("limits", {}):
        options.append(f"--memory={_memory(container['resources']['limits']['memory'])}")
    if "command" in container:
        options.append(f"--entrypoint={json.dumps(container['command'])}")
    return Run(options, args, ports)


def _probes() -> dict[str, dict[str, Any]]:
    (container,) = _pod_spec()["containers"]
    return {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe", "startupProbe")
            if kind in container}


@pytest.fixture
def running(podman: Podman, image: str, tmp_path: Path) -> Iterator[tuple[Run, str]]:
    """The image running as the DaemonSet runs it; its name."""
    run = _daemonset_run(tmp_path)
    name = f"gpunode-exporter-test-{os.getpid()}"
    try:
        podman("run", "--detach", f"--name={name}", *run.options, image, *run.args, timeout=120)
        yield run, name
    finally:
        podman("rm", "--force", "--ignore", "--time=0", name)


def _running(podman: Podman, name: str) -> bool:
    return podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"


def test_the_image_runs_as_the_daemonset_runs_it(podman: Podman, running: tuple[Run, str], tmp_path: Path) -> None:
    run, name = running
    port = run.ports[int(cli.DEFAULT_LISTEN.rpartition(":")[2])]

    def logs() -> str:
        done = podman("logs", name, check=False)
        return f"\n--- podman logs {name}:\n{done.stdout}{done.stderr}"

    try:
        wait_for_port(port, alive=lambda: _running(podman, name), seconds=60)
    except AssertionError as error:
        raise AssertionError(f"{error}{logs()}") from None
    for kind, probe in _probes().items():
        answer = requests.get(f"http://127.0.0.1:{run.ports[probe['port']]}{probe['path']}", timeout=10)
        assert answer.status_code == 200, f"{kind} {probe}: {answer.status_code}{logs()}"
    series = parse_exposition(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
    # No GPU and no NVIDIA driver here: the gpu collector says so (README.md, "How failures show")
    # and the PCI count is still served; every other collector works.
    success = {dict(k)["collector"]: v for k, v in series["gpunode_scrape_collector_success"].items()}
    enabled = collectors.enabled_collectors(cli.parse_args(run.args)[1])
    assert success == {c: 0.0 if c == "gpu" else 1.0 for c in enabled}, logs()
    assert (("source", "pci"),) in series["gpunode_gpus_visible"]
    assert (("source", "nvml"),) not in series["gpunode_gpus_visible"]
    config = yaml.safe_load((tmp_path / "configmap" / "config" / "config.yml").read_text())
    assert series["gpunode_gpus_expected"][()] == config["gpu"]["expected_count"], "the ConfigMap's config is read"
    # The kernel log: the hostPath gives the device node but no device rule to read it, so the
    # exporter falls back to NVML's events (docs/kubernetes.md, "The kernel log in a container").
    assert series["gpunode_xid_source"][(("source", "kmsg"),)] == 0, logs()
    # A read-only root, and the state directory the one place written.
    assert set(series["gpunode_xid_state_errors_total"].values()) == {0.0}, logs()
    assert any((_state_dir(tmp_path) / "state").iterdir()), "nothing written to the state directory"


def _copy_sources(containerfile: str, into: Path) -> list[str]:
    """What the Containerfile's COPY lines take from the context, copied from the checkout into `into`."""
    names = [name for line in re.findall(r"^COPY (?!--from)(.+) \S+$", containerfile, re.MULTILINE)
             for name in line.split()]
    for name in names:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, into / name)
    return names


def test_a_containerfile_copying_a_missing_path_does_not_build(podman: Podman, base_image: list[str],
                                                                 tmp_path: Path) -> None:
    """The build the test above makes fails on a broken Containerfile, and podman names what broke
    it: a copy of the Containerfile whose first COPY names a path the context lacks."""
    text = CONTAINERFILE.read_text()
    first = _copy_sources(text, tmp_path)[0]
    broken = tmp_path / "Containerfile"
    broken.write_text(re.sub(rf"^(COPY (?!--from).*?){re.escape(first)}\b", rf"\g<1>missing-{first}", text,
                             count=1, flags=re.MULTILINE))
    tag = f"{TEST_IMAGE}:broken-{os.getpid()}"
    try:
        built = _build(podman, tmp_path, broken, tag)
    finally:
        _remove_image(podman, tag)
    assert built.returncode != 0
    assert f"missing-{first}" in built.stderr and "no such file or directory" in built.stderr, built.stderr
