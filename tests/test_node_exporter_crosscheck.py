"""Cross-check against a real peer: Debian's node_exporter 1.5 mountstats collector.

For every real kernel sample, node_exporter and our NFS collector read the same
procfs tree; every per-operation counter both export must be equal, and both must
export the same operations.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode_exporter.collector.nfs import NFSCollector
from gpunode_exporter.procfs import mountstats
from tests.helpers import collect_samples, free_port, nfs_context, parse_exposition, wait_for_port

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
SAMPLES = sorted((Path(__file__).parent / "fixtures" / "mountstats-real").glob("*.txt"))
# node_exporter's operation metric -> ours
PAIRS = {
    "node_mountstats_nfs_operations_requests_total": "gpunode_nfs_rpc_operations_total",
    "node_mountstats_nfs_operations_transmissions_total": "gpunode_nfs_rpc_transmissions_total",
    "node_mountstats_nfs_operations_major_timeouts_total": "gpunode_nfs_rpc_major_timeouts_total",
    "node_mountstats_nfs_operations_sent_bytes_total": "gpunode_nfs_rpc_sent_bytes_total",
    "node_mountstats_nfs_operations_received_bytes_total": "gpunode_nfs_rpc_received_bytes_total",
    "node_mountstats_nfs_operations_queue_time_seconds_total": "gpunode_nfs_rpc_queue_seconds_total",
    "node_mountstats_nfs_operations_response_time_seconds_total": "gpunode_nfs_rpc_rtt_seconds_total",
    "node_mountstats_nfs_operations_request_time_seconds_total": "gpunode_nfs_rpc_execute_seconds_total",
}
RDMA_LINE = re.compile(r"^\txprt:\trdma .*\n", re.M)
_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)", re.M)

pytestmark = pytest.mark.skipif(NODE_EXPORTER is None,
                                reason="node_exporter not installed (scripts/install-deps.sh)")


def write_procfs(root: Path, mountstats: str) -> None:
    """mountstats, and the mountinfo node_exporter also reads (it pairs entries by index)."""
    pid = root / "4242"
    pid.mkdir(parents=True, exist_ok=True)
    if not (root / "self").is_symlink():
        (root / "self").symlink_to("4242")
    (pid / "mountstats").write_text(mountstats)
    lines = [f"{30 + i} 1 0:{40 + i} / {mp} rw,relatime - {fs} {dev} rw"
             for i, (dev, mp, fs) in enumerate(_DEVICE.findall(mountstats))]
    (pid / "mountinfo").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("procfs")
    write_procfs(root, "")
    port = free_port()
    proc = subprocess.Popen(
        [NODE_EXPORTER, "--collector.disable-defaults", "--collector.mountstats",
         f"--path.procfs={root}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for_port(port, alive=lambda: proc.poll() is None)
        yield root, url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    return parse_exposition(urllib.request.urlopen(url, timeout=10).read().decode())


def wrapped_times(text: str) -> set[tuple[str, str, str]]:
    """(export, op, metric) whose raw millisecond sum is a negative number wrapped to u64."""
    names = {"queue_ms": "gpunode_nfs_rpc_queue_seconds_total", "rtt_ms": "gpunode_nfs_rpc_rtt_seconds_total",
             "execute_ms": "gpunode_nfs_rpc_execute_seconds_total"}
    return {(m.export, op.name, metric) for m in mountstats.parse(text).mounts for op in m.operations
            for field, metric in names.items() if getattr(op, field) >= mountstats.WRAPPED_THRESHOLD}


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
def test_operation_counters_equal_node_exporter(node_exporter: tuple[Path, str], sample: Path) -> None:
    root, url = node_exporter
    text = sample.read_text()
    write_procfs(root, text)
    ours = collect_samples(NFSCollector(nfs_context(root, every_series=True)))
    if "xprt:\trdma" in text:
        # node_exporter 1.5 (procfs 0.8) rejects the whole file when a mount uses RDMA;
        # its per-op counters can still be compared once the rdma lines are gone.
        assert ours["gpunode_nfs_transport_sends_total"], "we must export RDMA transports"
        write_procfs(root, RDMA_LINE.sub("", text))
    theirs = scrape(url)
    assert theirs["node_scrape_collector_success"][(("collector", "mountstats"),)] == 1

    # node_exporter has no mountpoint label and keeps the first mount of each export.
    first_mountpoint: dict[str, str] = {}
    for labels in ours.get("gpunode_nfs_rpc_operations_total", {}):
        d = dict(labels)
        first_mountpoint.setdefault(d["export"], d["mountpoint"])
    wrapped = wrapped_times(text)
    compared = 0
    for their_name, our_name in PAIRS.items():
        their_series = theirs.get(their_name, {})
        for labels, value in their_series.items():
            d = dict(labels)
            key = (("export", d["export"]), ("mountpoint", first_mountpoint[d["export"]]),
                   ("op", d["operation"]))
            mine = ours.get(our_name, {}).get(key)
            if mine is None and (d["export"], d["operation"], our_name) in wrapped:
                continue  # a sum the kernel wrapped: we omit it, node_exporter passes it on
            assert mine is not None, f"{our_name}{key} missing; node_exporter has {value}"
            assert mine == pytest.approx(value, rel=1e-12), f"{our_name}{key}"
            compared += 1
        # and we export no operation for these mounts that the peer lacks
        theirs_ops = {(dict(k)["export"], dict(k)["operation"]) for k in their_series}
        ours_ops = {(dict(k)["export"], dict(k)["op"]) for k in ours.get(our_name, {})
                    if dict(k)["mountpoint"] == first_mountpoint.get(dict(k)["export"])}
        assert ours_ops == {k for k in theirs_ops if (*k, our_name) not in wrapped}
    if "per-op statistics" in text:
        assert compared > 0, "nothing compared"
