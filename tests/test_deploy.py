"""deploy/: the Containerfile and the Kubernetes manifests hold together and work as far as this
machine allows: no container runtime or cluster here, so the manifests are checked against
Kubernetes' and the Prometheus operator's schemas, and the exporter is run with exactly the
arguments the DaemonSet gives, each mounted path pointed at a fixture."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import requests
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring

from gpunode_common import __version__
from gpunode_exporter import cli
from gpunode_exporter.collector import COLLECTORS
from tests.helpers import free_port, parse_exposition, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
FIXTURES = ROOT / "tests" / "fixtures"
KUBERNETES_VERSIONS = ("1.27", "1.30", "1.33")  # from the oldest still common to a recent one


def _documents(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def _daemonset() -> dict[str, Any]:
    (ds,) = [d for d in _documents("daemonset.yaml") if d["kind"] == "DaemonSet"]
    return ds


def _container() -> dict[str, Any]:
    (container,) = _daemonset()["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_match_the_kubernetes_schema(version: str) -> None:
    for doc in _documents("daemonset.yaml"):
        kubernetes_validate.validate(doc, version, strict=True)  # raises on an unknown or wrong field


def _unknown(given: Any, kept: Any, where: str = "") -> list[str]:
    """The keys of `given` that `kept` (what the model kept of it) lacks, as paths."""
    found = []
    if isinstance(given, dict):
        for key, value in given.items():
            if isinstance(kept, dict) and key in kept:
                found += _unknown(value, kept[key], f"{where}.{key}")
            else:
                found.append(f"{where}.{key}")
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (g, k) in enumerate(zip(given, kept, strict=True)):
            found += _unknown(g, k, f"{where}[{i}]")
    return found


def test_podmonitor_matches_the_operators_schema() -> None:
    (doc,) = _documents("podmonitor.yaml")
    model = monitoring.PodMonitor.model_validate(doc)  # types and required fields
    # The models ignore fields they do not know; a typo would pass silently, so compare.
    assert _unknown(doc, model.model_dump(by_alias=True, exclude_unset=True)) == []
    assert model.spec.selector.match_labels == _daemonset()["spec"]["selector"]["matchLabels"]
    ports = {p["name"] for p in _container()["ports"]}
    assert {e.port for e in model.spec.pod_metrics_endpoints} <= ports


def test_the_schema_check_finds_a_misspelt_field() -> None:
    (doc,) = _documents("podmonitor.yaml")
    doc["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    model = monitoring.PodMonitor.model_validate(doc)
    assert _unknown(doc, model.model_dump(by_alias=True, exclude_unset=True)) == [
        ".spec.podMetricsEndpoints[0].intervall"]
    ds = _daemonset()
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES_VERSIONS[-1], strict=True)


def _flags(args: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in args)


def test_the_daemonsets_arguments_are_the_exporters_and_their_paths_are_mounted() -> None:
    container = _container()
    args = container["args"]
    cli.parse_args(args)  # exits on a flag the exporter does not take
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _daemonset()["spec"]["template"]["spec"]["volumes"]}
    assert set(mounts.values()) == set(volumes), "every volume mounted, every mount a volume"
    for flag, value in _flags(args).items():
        if flag.startswith(("--path.", "--config.")):
            assert any(value == m or value.startswith(m + "/") for m in mounts), f"{flag}={value} is not mounted"
    assert {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")} == \
        {_flags(args)["--path.state"]}, "only the state directory is writable"
    port = int(_flags(args)["--web.listen-address"].rsplit(":", 1)[1])
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["image"].endswith(f":{__version__}"), "the image tag is the release's version"
    caps = container["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["SYSLOG", "DAC_READ_SEARCH", "SYS_PTRACE"]}, \
        "the three the systemd unit grants (docs/install.md), no more"


def test_the_containerfile_builds_what_the_daemonset_runs() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for name in source.split():
            assert (ROOT / name).exists(), f"COPY {name}: not in the repository"
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.MULTILINE)
    assert yaml.safe_load(entrypoint) == ["gpunode-exporter"]
    cli.parse_args(yaml.safe_load(cmd))
    (expose,) = re.findall(r"^EXPOSE (\d+)$", text, re.MULTILINE)
    assert int(expose) == _container()["ports"][0]["containerPort"] == int(cli.DEFAULT_LISTEN[1:])
    # The CMD's defaults are the DaemonSet's paths.
    assert set(yaml.safe_load(cmd)) <= set(_container()["args"])


def test_the_exporter_runs_with_the_daemonsets_arguments(tmp_path: Path) -> None:
    """Each mountPath is pointed at a fixture of what the host would have there; nothing else changes,
    except a simulated NVML (there is no GPU here) and a free port."""
    container = _container()
    config = yaml.safe_load(next(d for d in _documents("daemonset.yaml") if d["kind"] == "ConfigMap")
                            ["data"]["config.yml"])
    config["staging"]["paths"] = [str(tmp_path)]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yml").write_text(yaml.safe_dump(config))
    # The host's /proc: a real kernel's mountstats, and a boot id (Xid state is kept per boot).
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs" / "real", proc, symlinks=True)
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("3a5c1b52-2d8e-4f0e-9b7a-6f1e2d3c4b5a\n")
    host = {"/host/proc": proc, "/host/sys": FIXTURES / "sysfs" / "dgx-h100",
            "/dev/kmsg": FIXTURES / "kmsg" / "real-xid.kmsg", "/dev/shm": tmp_path,
            "/var/lib/gpunode-exporter": tmp_path / "state", "/etc/gpunode-exporter": tmp_path / "config"}
    assert set(host) == {m["mountPath"] for m in container["volumeMounts"]}

    def on_host(value: str) -> str:
        for mount, fixture in host.items():
            if value == mount or value.startswith(mount + "/"):
                return str(fixture) + value[len(mount):]
        return value

    port = free_port()
    args = [f"{flag}={on_host(value)}" for flag, value in _flags(container["args"]).items()
            if flag != "--web.listen-address"]
    args += [f"--web.listen-address=127.0.0.1:{port}",
             f"--nvml.simulate={ROOT / 'exporter/nvmlsim/scenarios/gpu122-uncorrectable-steps.yaml'}"]
    server = subprocess.Popen([sys.executable, "-m", "gpunode_exporter", *args], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, alive=lambda: server.poll() is None)
        probe = container["readinessProbe"]["httpGet"]["path"]
        assert requests.get(f"http://127.0.0.1:{port}{probe}", timeout=10).status_code == 200
        deadline = time.monotonic() + 10
        while True:  # the Xid reader reads the kernel log in its own thread
            series = parse_exposition(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
            if series.get("gpunode_xid_source", {}).get((("source", "kmsg"),)) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
    success = {dict(k)["collector"]: v for k, v in series["gpunode_scrape_collector_success"].items()}
    every = {name for name, c in COLLECTORS.items() if c.default_enabled}
    assert success == dict.fromkeys(every, 1.0), (success, err)
    assert series["gpunode_xid_source"][(("source", "kmsg"),)] == 1
    assert series["gpunode_gpus_expected"][()] == 8
    assert series["gpunode_nfs_rpc_operations_total"], "the host's NFS mounts, read from its PID 1 or self"
    assert series["gpunode_staging_size_bytes"]
    assert (tmp_path / "state" / "xid-state.json").exists(), "Xid counts kept in the mounted state directory"
