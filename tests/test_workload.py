"""Which workload each GPU serves: cgroup layouts of real kernels, the job-mapping directory, the
environment allow-list, the configured order, minors mapped to NVML indices, and the metrics."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunode_common.config import ConfigError
from gpunode_exporter import workload
from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.gpu_processes import GPUProcessesCollector
from gpunode_exporter.config import Config, WorkloadConfig, load
from gpunode_exporter.nvml import Session
from gpunode_exporter.procfs import cgroup
from tests.fakeproc import FakeProc
from tests.fixtures.cgroup import capture
from tests.helpers import collect_samples, simulated_nvml

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
ALL = frozenset(workload.SOURCES)
PBS = (re.compile(r"/pbs_jobs\.service/jobid/(?P<workload>[^/]+)"),)
POD, CID = capture.POD, capture.CID
# Layout -> what each cgroup source reads from it.
EXPECTED = {
    "slurm-v1": {"slurm": "77"},
    "slurm-v1-multiple-slurmd": {"slurm": "5"},
    "slurm-v2": {"slurm": "4242", "systemd": None},
    "kubernetes-systemd-burstable": {"kubernetes": POD, "container": CID},
    "kubernetes-systemd-guaranteed": {"kubernetes": POD, "container": CID},
    "kubernetes-cgroupfs-besteffort-v1": {"kubernetes": POD},
    "kubernetes-cgroupfs-guaranteed": {"kubernetes": POD},
    "docker-systemd": {"container": CID},
    "docker-cgroupfs-v1": {"container": CID},
    "podman-rootless": {"container": CID},
    "systemd-service": {"systemd": "vllm-inference.service"},
    "login-session": {},
    "pbs-pro": {"pattern": "1234.pbs-server", "systemd": "pbs_jobs.service"},
}


def _identify(data: bytes) -> dict[str, str]:
    return workload.identify_paths(cgroup.parse_cgroup(data), ALL, PBS)


@pytest.mark.parametrize("name", sorted(capture.LAYOUTS))
def test_each_layout_as_the_kernel_printed_it(name: str) -> None:
    want = {k: v for k, v in EXPECTED[name].items() if v is not None}
    assert _identify((FIXTURES / f"{name}.cgroup").read_bytes()) == want


def _cgroups_writable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    if not os.access(capture._root("v2"), os.W_OK) or not os.access(capture._root("memory"), os.W_OK):
        return "no writable cgroup v2 and v1 memory hierarchies here"
    return None


@pytest.mark.skipif(_cgroups_writable() is not None, reason=str(_cgroups_writable()))
@pytest.mark.parametrize("name", ["slurm-v2", "slurm-v1", "kubernetes-systemd-burstable", "docker-cgroupfs-v1"])
def test_live_kernel_agrees_with_the_fixture(name: str) -> None:
    """The running kernel, with a process placed in the layout now, gives what the fixture gives."""
    want = {k: v for k, v in EXPECTED[name].items() if v is not None}
    assert _identify(capture.capture(name)) == want


def test_paths_behind_a_cgroup_namespace_still_match() -> None:
    """An exporter in a container of its own sees other cgroups as /../../..."""
    data = f"0::/../../kubepods-besteffort-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n".encode()
    assert _identify(data)["kubernetes"] == POD


@pytest.mark.parametrize("text", [b"garbage\n", b"x::/a\n", b"0::relative\n", b"\xd9\xa1::/a\n"])
def test_malformed_cgroup_file_is_its_own_error(text: bytes) -> None:
    with pytest.raises(cgroup.CgroupFileError):
        cgroup.parse_cgroup(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_cgroup_parser_any_bytes(data: bytes) -> None:
    try:
        paths = cgroup.parse_cgroup(data)
    except cgroup.CgroupFileError:
        return
    for path in paths:
        path.encode()  # valid UTF-8: a label value
        for found in workload.identify_paths([path], ALL, PBS).values():
            assert found and found.encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"A", b"SLURM_JOB_ID", b"SECRET", b"TORCHELASTIC_RUN_ID"]),
                          st.binary(max_size=20).filter(lambda v: b"\0" not in v)), max_size=6))
def test_environment_reads_only_the_allow_list(entries: list[tuple[bytes, bytes]]) -> None:
    environ = b"\0".join(name + b"=" + value for name, value in entries)
    names = (b"TORCHELASTIC_RUN_ID", b"SLURM_JOB_ID")
    value = workload.environment_value(environ, names)
    allowed = [v.decode(errors="replace").strip() for n, v in entries if n in names]
    if value is not None:
        assert value in allowed and value not in ("", "none")
        assert value.encode()


def test_environment_order_and_torchrun_default() -> None:
    environ = b"SLURM_JOB_ID=881\0TORCHELASTIC_RUN_ID=none\0HOME=/root\0"
    assert workload.environment_value(environ, (b"TORCHELASTIC_RUN_ID", b"SLURM_JOB_ID")) == "881"
    environ = b"SLURM_JOB_ID=881\0TORCHELASTIC_RUN_ID=llama-7\0"
    assert workload.environment_value(environ, (b"TORCHELASTIC_RUN_ID", b"SLURM_JOB_ID")) == "llama-7"
    assert workload.environment_value(b"HOME=/root\0", (b"SLURM_JOB_ID",)) is None


def test_job_mapping_directory(tmp_path: Path) -> None:
    """dcgm-exporter's format: a file per GPU index holding job ids; anything else is ignored."""
    (tmp_path / "0").write_text("5521\n")
    (tmp_path / "1").write_text("\n5522\n5523\n")
    (tmp_path / "2").write_text("")
    (tmp_path / "notes.txt").write_text("7\n")
    (tmp_path / "\u0663").write_text("8\n")  # an Arabic-Indic digit is no GPU index
    assert workload.read_job_mapping(str(tmp_path)) == {0: "5521", 1: "5522"}
    assert workload.read_job_mapping(str(tmp_path / "missing")) == {}


def test_resolve_follows_the_order() -> None:
    a = workload.Identity((("container", "c1"), ("environment", "run7"), ("slurm", "42")))
    b = workload.Identity((("slurm", "42"),))
    c = workload.Identity((("slurm", "43"),))
    assert workload.resolve([a, b, c], None, workload.SOURCES) == workload.Assignment("slurm", "42")
    assert workload.resolve([a], "99", workload.SOURCES) == workload.Assignment("job_mapping", "99")
    assert workload.resolve([a], "99", ("environment", "job_mapping")) == workload.Assignment("environment", "run7")
    assert workload.resolve([workload.Identity()], None, workload.SOURCES) == workload.Assignment("unidentified", "")
    # Two jobs on one GPU, one process each: the smaller id, every scrape the same.
    assert workload.resolve([c, b], None, workload.SOURCES) == workload.Assignment("slurm", "42")


def test_node_workload_is_the_one_holding_most_gpus() -> None:
    big, small = workload.Assignment("slurm", "9"), workload.Assignment("slurm", "10")
    assert workload.node_workload({0: big, 1: big, 2: small}) == big
    assert workload.node_workload({}) is None


def test_config_checks_sources_and_patterns(tmp_path: Path) -> None:
    for text, message in (("workload: {sources: [slurm, lsf]}\n", "unknown source 'lsf'"),
                          ("workload: {cgroup_patterns: ['(']}\n", "cgroup_patterns"),
                          ("workload: {cgroup_patterns: ['/job_(\\d+)']}\n", "no group"),
                          ("workload: {job_mapping_dir: 3}\n", "want a string")):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load(path)


# NVML numbers its devices by PCI bus; the driver's minors follow its probe order: here reversed.
_SCENARIO = {"gpus": [{"uuid": f"GPU-00000000-0000-0000-0000-{i:012x}", "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                       "minor": 3 - i} for i in range(4)]}


def _collector(proc: FakeProc, config: Config) -> GPUProcessesCollector:
    return GPUProcessesCollector(Context(procfs=proc.root, sysfs=proc.root, config=config,
                                         route_lookup=lambda _a: None, nvml=Session()))


def test_metrics_map_device_minors_to_nvml_indices(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    slurm = (FIXTURES / "slurm-v2.cgroup").read_bytes()
    pod = (FIXTURES / "kubernetes-systemd-burstable.cgroup").read_bytes()
    proc.spawn(10, gpu=True, cgroup=slurm, environ=b"TORCHELASTIC_RUN_ID=run7\0AWS_SECRET_ACCESS_KEY=s3cr3t\0")
    proc.spawn(11, gpu=True, cgroup=slurm)
    proc.open_gpu(11)  # holds /dev/nvidia3 and /dev/nvidia0
    proc.spawn(12, cgroup=pod)  # no GPU: not counted
    with simulated_nvml(_SCENARIO):
        got = collect_samples(_collector(proc, Config()))
    gpus = {dict(k)["gpu"]: dict(k) for k in got["gpunode_gpu_workload_info"]}
    # /dev/nvidia3 is NVML index 0 here, /dev/nvidia0 index 3.
    assert set(gpus) == {"0", "3"}
    assert gpus["0"]["uuid"].endswith("000000000000") and gpus["3"]["uuid"].endswith("000000000003")
    assert {(g["source"], g["workload"]) for g in gpus.values()} == {("slurm", "4242")}
    assert list(got["gpunode_node_workload_info"]) == [(("source", "slurm"), ("workload", "4242"))]
    assert "s3cr3t" not in repr(got) and "run7" not in repr(got)


def test_environment_and_unidentified(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.spawn(10, gpu=True, cgroup=(FIXTURES / "login-session.cgroup").read_bytes(),
               environ=b"TORCHELASTIC_RUN_ID=run7\0")
    with simulated_nvml(_SCENARIO):
        got = collect_samples(_collector(proc, Config()))
        assert list(got["gpunode_node_workload_info"]) == [(("source", "environment"), ("workload", "run7"))]
        quiet = Config(workload=WorkloadConfig(environment=()))
        got = collect_samples(_collector(proc, quiet))
    assert list(got["gpunode_node_workload_info"]) == [(("source", "unidentified"), ("workload", ""))]


def test_idle_node_has_no_workload_and_needs_no_nvml(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.spawn(12, cgroup=(FIXTURES / "slurm-v2.cgroup").read_bytes())
    got = collect_samples(_collector(proc, Config()))  # no NVML at all: not even asked
    assert "gpunode_node_workload_info" not in got and "gpunode_gpu_workload_info" not in got


def test_without_nvml_the_node_workload_stands(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.spawn(10, gpu=True, cgroup=(FIXTURES / "slurm-v1.cgroup").read_bytes())
    got = collect_samples(_collector(proc, Config()))
    assert "gpunode_gpu_workload_info" not in got
    assert list(got["gpunode_node_workload_info"]) == [(("source", "slurm"), ("workload", "77"))]


def test_job_mapping_wins_by_default_over_cgroups(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    proc = FakeProc(tmp_path / "proc")
    proc.spawn(10, gpu=True, cgroup=(FIXTURES / "slurm-v2.cgroup").read_bytes())  # /dev/nvidia3: index 0
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("prolog-77\n")
    config = Config(workload=WorkloadConfig(job_mapping_dir=str(mapping)))
    with simulated_nvml(_SCENARIO):
        got = collect_samples(_collector(proc, config))
    assert list(got["gpunode_node_workload_info"]) == [(("source", "job_mapping"), ("workload", "prolog-77"))]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_environ_is_counted(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.spawn(10, gpu=True, cgroup=(FIXTURES / "login-session.cgroup").read_bytes(), environ=b"A=1\0")
    (tmp_path / "10" / "environ").chmod(0)
    got = collect_samples(_collector(proc, Config()))
    assert got["gpunode_gpu_process_unreadable"][(("file", "environ"),)] == 1
