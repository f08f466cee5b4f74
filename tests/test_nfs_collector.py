"""The NFS collector: mountstats on disk -> metric families."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from gpunode_common.config import ConfigError
from gpunode_exporter import config
from gpunode_exporter.collector.nfs import NFSCollector, transport_series_name
from gpunode_exporter.config import NFS_TRANSPORT_SERIES_ALL, NFSConfig
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


def test_each_nconnect_transport_is_its_own_series_with_per_transport(procfs: Path) -> None:
    got = collect_samples(NFSCollector(nfs_context(procfs, every_series=True)))
    in_flight = {dict(k)["transport"]: v for k, v in got["gpunode_nfs_transport_in_flight_sum_total"].items()
                 if dict(k)["mountpoint"] == "/mnt/ckpt dir"}
    assert in_flight == {"0": 76812800, "1": 76787200}
    # udp reports no connections
    assert all(dict(k)["protocol"] != "udp" for k in got["gpunode_nfs_transport_connects_total"])


def test_a_mounts_transports_are_summed_by_default(procfs: Path) -> None:
    got = collect_samples(NFSCollector(nfs_context(procfs)))
    mine = {name: {dict(k)["transport"]: v for k, v in series.items() if dict(k)["mountpoint"] == "/mnt/ckpt dir"}
            for name, series in got.items() if name.startswith("gpunode_nfs_transport_")}
    assert mine["gpunode_nfs_transport_in_flight_sum_total"] == {"all": 76812800 + 76787200}
    assert mine["gpunode_nfs_transport_sends_total"] == {"all": 600100 + 599900}
    assert mine["gpunode_nfs_transport_backlog_sum_total"] == {"all": 1200 + 1100}
    assert mine["gpunode_nfs_transport_max_slots"] == {"all": 128}  # the largest, not a sum


def test_summed_transports_equal_the_sum_of_each(tmp_path: Path) -> None:
    """On real kernels' samples (nconnect=8 rdma mounts among them): per mount and protocol, each
    summed counter is the sum of the transports' and max_slots their largest."""
    real = FIXTURES / "real"
    summed = collect_samples(NFSCollector(nfs_context(real)))
    each = collect_samples(NFSCollector(nfs_context(real, every_series=True)))
    checked = 0
    for name, series in summed.items():
        if not name.startswith("gpunode_nfs_transport_"):
            continue
        for key, value in series.items():
            labels = dict(key)
            assert labels["transport"] == "all"
            parts = [v for k, v in each[name].items() if {**dict(k), "transport": "all"} == labels]
            assert parts, (name, labels)
            assert value == (max(parts) if name.endswith("max_slots") else sum(parts)), (name, labels)
            checked += 1
    assert checked > 20


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


_PER_OP = ("operations", "transmissions", "major_timeouts", "errors", "sent_bytes", "received_bytes",
           "queue_seconds", "rtt_seconds", "execute_seconds")


def _per_mount_sums(got: dict) -> dict:
    sums: dict = {}
    for family in _PER_OP:
        for labels, value in got.get(f"gpunode_nfs_rpc_{family}_total", {}).items():
            mount = tuple(kv for kv in labels if kv[0] != "op")
            sums[family, mount] = sums.get((family, mount), 0) + value
    return sums


def test_other_operations_are_summed_so_mount_totals_stay_whole() -> None:
    real = FIXTURES / "real"
    default = collect_samples(NFSCollector(nfs_context(real)))
    every = collect_samples(NFSCollector(nfs_context(real, every_series=True)))
    ops = {dict(k)["op"] for k in default["gpunode_nfs_rpc_operations_total"]}
    assert "OTHER" in ops and ops - {"OTHER"} <= set(NFSConfig().operations)
    assert len(default["gpunode_nfs_rpc_operations_total"]) < len(every["gpunode_nfs_rpc_operations_total"]) / 2
    assert _per_mount_sums(default) == pytest.approx(_per_mount_sums(every))
    # A served operation's series are the same either way.
    write = [k for k in default["gpunode_nfs_rpc_sent_bytes_total"] if dict(k)["op"] == "WRITE"]
    assert write and all(default["gpunode_nfs_rpc_sent_bytes_total"][k] == every["gpunode_nfs_rpc_sent_bytes_total"][k]
                         for k in write)


def test_a_wrapped_sum_leaves_other_without_that_series(procfs: Path) -> None:
    # The kernel wrapped a negative queue sum of NULL (not served): OTHER has no queue series,
    # as a served operation would not, and keeps the others.
    stats = procfs / "4242" / "mountstats"
    text = stats.read_text()
    lines = text.splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.strip().startswith("NULL:"))
    fields = lines[i].split()
    fields[6] = str(2 ** 64 - 5)  # queue ms
    lines[i] = "\t" + " ".join(fields) + "\n"
    stats.write_text("".join(lines))
    got = collect_samples(NFSCollector(nfs_context(procfs)))
    other = [k for k in got["gpunode_nfs_rpc_operations_total"] if dict(k)["op"] == "OTHER"]
    mount = dict(other[0])["mountpoint"] if other else None
    wrapped = [k for k in other if dict(k)["mountpoint"] == mount]
    assert wrapped and not [k for k in got["gpunode_nfs_rpc_queue_seconds_total"] if k in wrapped]
    assert all(k in got["gpunode_nfs_rpc_rtt_seconds_total"] for k in wrapped)


def test_transport_series_default_to_what_the_rules_read() -> None:
    got = collect_samples(NFSCollector(nfs_context(FIXTURES / "real")))
    served = {name.removeprefix("gpunode_nfs_transport_").removesuffix("_total") for name in got
              if name.startswith("gpunode_nfs_transport_")}
    assert served == set(NFSConfig().transport_series)
    every = collect_samples(NFSCollector(nfs_context(FIXTURES / "real", every_series=True)))
    assert {n for n in every if n.startswith("gpunode_nfs_transport_")} == {
        spec.name for spec in NFSCollector.metrics if spec.name.startswith("gpunode_nfs_transport_")}
    assert set(NFS_TRANSPORT_SERIES_ALL) == {transport_series_name(spec) for spec in NFSCollector.metrics
                                             if spec.name.startswith("gpunode_nfs_transport_")}


@pytest.mark.parametrize(("nfs", "error"), [
    ({"operations": ["read"]}, "no NFS operation name"),
    ({"operations": ["OTHER"]}, "no NFS operation name"),
    ({"transport_series": ["sends", "slots"]}, "unknown 'slots'"),
    ({"operations": 7}, "want a list of strings"),
])
def test_bad_nfs_series_choices_are_config_errors(tmp_path: Path, nfs: dict, error: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump({"nfs": nfs}))
    with pytest.raises(ConfigError, match=error):
        config.load(path)


def test_all_may_be_written_without_brackets(tmp_path: Path) -> None:
    path = tmp_path / "c.yml"
    path.write_text("nfs: {operations: all, transport_series: [all]}\n")
    assert config.load(path).nfs == NFSConfig(operations=("all",), transport_series=("all",))


def test_the_rule_pack_and_dashboards_read_only_served_operations() -> None:
    from gpunode_rulepack import shipped_spec

    wanted = re.fullmatch(r'op=~"(.*)"', shipped_spec()["nfs"]["ops"]).group(1).split("|")
    assert set(wanted) <= set(NFSConfig().operations)
    for path in (Path(__file__).parent.parent / "rulepack" / "dashboards").glob("*.py"):
        assert set(re.findall(r'op=\\?"(\w+)\\?"', path.read_text())) <= set(NFSConfig().operations), path
