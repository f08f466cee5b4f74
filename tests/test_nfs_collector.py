"""The NFS collector: mountstats on disk -> metric families."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporter.collector.nfs import NFSCollector
from tests.helpers import collect_samples, nfs_context

FIXTURES = Path(__file__).parent / "fixtures" / "procfs"


@pytest.fixture
def procfs(tmp_path: Path) -> Path:
    """A writable copy of the edge-case tree."""
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "edge", root, symlinks=True)
    return root


def ckpt(op: str) -> tuple:
    return (("export", "stor-a.example:/ckpt"), ("mountpoint", "/mnt/ckpt dir"), ("op", op))


def test_slot_wait_and_network_split_in_seconds(procfs: Path) -> None:
    got = collect_samples(NFSCollector(nfs_context(procfs)))
    # The fixture mirrors the Lablup B200 operations report's WRITE: 1,495 ms of 1,621 ms waiting for a slot.
    ops = got["gpunode_nfs_rpc_operations_total"][ckpt("WRITE")]
    assert got["gpunode_nfs_rpc_queue_seconds_total"][ckpt("WRITE")] / ops == pytest.approx(1.495)
    assert got["gpunode_nfs_rpc_rtt_seconds_total"][ckpt("WRITE")] / ops == pytest.approx(0.126)
    assert got["gpunode_nfs_rpc_execute_seconds_total"][ckpt("WRITE")] / ops == pytest.approx(1.621)
    assert got["gpunode_nfs_rpc_errors_total"][ckpt("GETATTR")] == 2


def test_each_nconnect_transport_is_its_own_series(procfs: Path) -> None:
    got = collect_samples(NFSCollector(nfs_context(procfs)))
    in_flight = {dict(k)["transport"]: v for k, v in got["gpunode_nfs_transport_in_flight_sum_total"].items()
                 if dict(k)["mountpoint"] == "/mnt/ckpt dir"}
    assert in_flight == {"0": 76812800, "1": 76787200}
    # udp reports no connections
    assert all(dict(k)["protocol"] != "udp" for k in got["gpunode_nfs_transport_connects_total"])


def test_mount_info_uses_injected_route_lookup(procfs: Path) -> None:
    asked: list[str] = []

    def lookup(address: str) -> str | None:
        asked.append(address)
        return "ib0" if address.startswith("10.20.") else None

    got = collect_samples(NFSCollector(nfs_context(procfs, lookup)))
    info = {dict(k)["mountpoint"]: dict(k) for k in got["gpunode_nfs_mount_info"]}
    assert info["/mnt/ckpt dir"]["device"] == "ib0"
    assert info["/mnt/ckpt dir"]["server_address"] == "10.20.0.5"
    assert info["/home"] == {"mountpoint": "/home", "export": "oldnas:/export/home", "protocol": "udp",
                             "server_address": "192.0.2.10", "device": ""}
    assert sorted(asked) == ["10.20.0.5", "10.20.0.6", "192.0.2.10"]


def test_without_mountinfo_the_address_comes_from_mountstats(procfs: Path) -> None:
    (procfs / "4242" / "mountinfo").unlink()
    got = collect_samples(NFSCollector(nfs_context(procfs)))
    addresses = {dict(k)["mountpoint"]: dict(k)["server_address"] for k in got["gpunode_nfs_mount_info"]}
    assert addresses == {"/mnt/ckpt dir": "stor-a.example", "/home": "oldnas", "/data": "10.20.0.6"}


def test_parse_errors_count_on_every_read(procfs: Path) -> None:
    collector = NFSCollector(nfs_context(procfs))
    first = collect_samples(collector)["gpunode_nfs_parse_errors_total"][()]
    second = collect_samples(collector)["gpunode_nfs_parse_errors_total"][()]
    assert (first, second) == (3, 6)


def test_falls_back_to_pid_1(procfs: Path) -> None:
    (procfs / "self").unlink()
    (procfs / "1").mkdir()
    shutil.copy(procfs / "4242" / "mountstats", procfs / "1" / "mountstats")
    assert collect_samples(NFSCollector(nfs_context(procfs)))["gpunode_nfs_rpc_operations_total"]


def test_missing_file_raises_so_the_scrape_reports_failure(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list(NFSCollector(nfs_context(tmp_path)).collect())


def test_mount_that_disappears_leaves_no_stale_series(procfs: Path) -> None:
    collector = NFSCollector(nfs_context(procfs))
    before = collect_samples(collector)
    stats = procfs / "4242" / "mountstats"
    text = stats.read_text()
    stats.write_text(text[: text.index("device oldnas")])
    after = collect_samples(collector)
    mountpoints = lambda got: {dict(k)["mountpoint"] for k in got["gpunode_nfs_mount_info"]}  # noqa: E731
    assert "/home" in mountpoints(before) and "/home" not in mountpoints(after)


def test_stacked_mount_of_one_export_is_exported_once(tmp_path: Path) -> None:
    section = (Path(__file__).parent / "fixtures" / "procfs" / "real" / "4242" / "mountstats").read_text()
    root = tmp_path / "proc"
    (root / "4242").mkdir(parents=True)
    (root / "self").symlink_to("4242")
    (root / "4242" / "mountstats").write_text(section)
    got = collect_samples(NFSCollector(nfs_context(root)))
    prod = [k for k in got["gpunode_nfs_mount_info"] if dict(k)["mountpoint"] == "/storage/prod"]
    assert section.count("mounted on /storage/prod ") == 2 and len(prod) == 1


def test_wrapped_time_is_omitted_not_exported(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True)
    sample = "procfs166-nfs4-queue-time-wrap-rhel7.3-FRAGMENT.txt"
    shutil.copy(Path(__file__).parent / "fixtures" / "mountstats-real" / sample, root / "self" / "mountstats")
    got = collect_samples(NFSCollector(nfs_context(root)))
    assert "gpunode_nfs_rpc_queue_seconds_total" not in got or not got["gpunode_nfs_rpc_queue_seconds_total"]
    assert len(got["gpunode_nfs_rpc_rtt_seconds_total"]) == 3


def test_slot_table_limits_from_sunrpc_sysctls(procfs: Path) -> None:
    got = collect_samples(NFSCollector(nfs_context(procfs)))["gpunode_nfs_slot_table_limit"]
    assert got == {(("protocol", "rdma"),): 128, (("protocol", "tcp"),): 65536, (("protocol", "udp"),): 128}
    (procfs / "sys" / "sunrpc" / "rdma_slot_table_entries").unlink()  # xprtrdma not loaded
    (procfs / "sys" / "sunrpc" / "udp_max_slot_table_entries").write_text("garbage\n")
    got = collect_samples(NFSCollector(nfs_context(procfs)))["gpunode_nfs_slot_table_limit"]
    assert got == {(("protocol", "tcp"),): 65536}


def test_a_host_proc_seen_from_a_container_reads_the_hosts_init(procfs: Path) -> None:
    # --path.procfs=/host/proc: `self` is the container, with none of the host's NFS mounts.
    (procfs / "1").mkdir()
    shutil.copy(procfs / "4242" / "mountstats", procfs / "1" / "mountstats")
    (procfs / "4242" / "mountstats").write_text("device tmpfs mounted on / with fstype tmpfs\n")
    assert collect_samples(NFSCollector(nfs_context(procfs)))["gpunode_nfs_rpc_operations_total"]
