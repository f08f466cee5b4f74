"""NFS client RPC statistics per mount, operation and transport (from mountstats)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.numbers import u64
from gpunode_exporter.procfs import mountinfo, mountstats

log = logging.getLogger(__name__)

_OP = ("mountpoint", "export", "op")
_XPRT = ("mountpoint", "export", "transport", "protocol")

OPERATIONS = MetricSpec("gpunode_nfs_rpc_operations_total", "counter",
                        "RPC requests completed, per mount and NFS operation (op=\"OTHER\": the mount's "
                        "operations not in nfs.operations, summed, as in every per-operation series).", _OP)
TRANSMISSIONS = MetricSpec("gpunode_nfs_rpc_transmissions_total", "counter",
                           "RPC transmissions, retransmissions included.", _OP)
MAJOR_TIMEOUTS = MetricSpec("gpunode_nfs_rpc_major_timeouts_total", "counter",
                            "RPC requests that hit a major timeout.", _OP)
MOUNT_MAJOR_TIMEOUTS = MetricSpec("gpunode_nfs_mount_major_timeouts_total", "counter",
                                  "RPC requests of any operation on the mount that hit a major timeout (the "
                                  "per-operation series summed): a rule reads a series per mount, not a dozen.",
                                  ("mountpoint", "export"))
ERRORS = MetricSpec("gpunode_nfs_rpc_errors_total", "counter",
                    "RPC requests that completed with an error status (kernels >= 5.3 only).", _OP)
SENT_BYTES = MetricSpec("gpunode_nfs_rpc_sent_bytes_total", "counter",
                        "Bytes sent, RPC headers and payload.", _OP)
RECEIVED_BYTES = MetricSpec("gpunode_nfs_rpc_received_bytes_total", "counter",
                            "Bytes received, RPC headers and payload.", _OP)
QUEUE_SECONDS = MetricSpec("gpunode_nfs_rpc_queue_seconds_total", "counter",
                           "Time requests waited for an RPC slot and in the transmit queue.", _OP)
RTT_SECONDS = MetricSpec("gpunode_nfs_rpc_rtt_seconds_total", "counter",
                         "Time from transmission to reply: network plus server.", _OP)
EXECUTE_SECONDS = MetricSpec("gpunode_nfs_rpc_execute_seconds_total", "counter",
                             "Whole request time, from creation to completion.", _OP)

SENDS = MetricSpec("gpunode_nfs_transport_sends_total", "counter",
                   "RPC requests sent on this transport (transport=\"all\": the mount's transports "
                   "summed, as in every transport series unless nfs.per_transport).", _XPRT)
RECEIVES = MetricSpec("gpunode_nfs_transport_receives_total", "counter",
                      "RPC replies received on this transport.", _XPRT)
BAD_XIDS = MetricSpec("gpunode_nfs_transport_bad_xids_total", "counter",
                      "Replies whose transaction id matched no request.", _XPRT)
CONNECTS = MetricSpec("gpunode_nfs_transport_connects_total", "counter",
                      "Connections made to the server (absent for udp).", _XPRT)
IN_FLIGHT_SUM = MetricSpec("gpunode_nfs_transport_in_flight_sum_total", "counter",
                           "Requests in flight summed at each send (req_u); divide its rate by "
                           "the sends rate for the mean slot occupancy.", _XPRT)
BACKLOG_SUM = MetricSpec("gpunode_nfs_transport_backlog_sum_total", "counter",
                         "Requests waiting for a free slot summed at each send (bklog_u).", _XPRT)
SENDING_SUM = MetricSpec("gpunode_nfs_transport_sending_sum_total", "counter",
                         "Sending-queue length summed at each send (sending_u; statvers 1.1).", _XPRT)
PENDING_SUM = MetricSpec("gpunode_nfs_transport_pending_sum_total", "counter",
                         "Requests awaiting a reply summed at each send (pending_u; statvers 1.1).",
                         _XPRT)
MAX_SLOTS = MetricSpec("gpunode_nfs_transport_max_slots", "gauge",
                       "Most RPC slots ever in use at once (high-water mark; transport=\"all\": the "
                       "largest of the mount's; rdma does not report it).",
                       _XPRT)

MOUNT_INFO = MetricSpec("gpunode_nfs_mount_info", "gauge",
                        "NFS mount: transport protocol, server address and the local interface "
                        "that routes to it (device is empty when no route is known).",
                        ("mountpoint", "export", "protocol", "server_address", "device"))
SLOT_TABLE_LIMIT = MetricSpec("gpunode_nfs_slot_table_limit", "gauge",
                              "Most RPC slots a new transport of this protocol may use (sunrpc sysctl; "
                              "NFSv4.1+ sessions may cap lower).", ("protocol",))
PARSE_ERRORS = MetricSpec("gpunode_nfs_parse_errors_total", "counter",
                          "Malformed mountstats sections skipped, counted on every read that saw one.")

# Transport metrics and the xprt field each comes from.
_TRANSPORT_FIELDS = (
    (SENDS, "sends"), (RECEIVES, "recvs"), (BAD_XIDS, "bad_xids"), (CONNECTS, "connect_count"),
    (IN_FLIGHT_SUM, "req_u"), (BACKLOG_SUM, "bklog_u"), (SENDING_SUM, "sending_u"),
    (PENDING_SUM, "pending_u"), (MAX_SLOTS, "max_slots"),
)


# sunrpc sysctls holding each transport's slot-table ceiling (rdma: only with xprtrdma loaded).
_SLOT_SYSCTLS = {"tcp": "tcp_max_slot_table_entries", "udp": "udp_max_slot_table_entries",
                 "rdma": "rdma_slot_table_entries"}


def read_slot_limits(procfs: Path) -> dict[str, int]:
    limits = {}
    for protocol, name in _SLOT_SYSCTLS.items():
        try:
            limits[protocol] = u64((procfs / "sys" / "sunrpc" / name).read_bytes().strip())
        except (OSError, ValueError):
            continue  # module not loaded, or not our business to fail the scrape over
    return limits


def read_own_or_init(procfs: Path, name: str) -> tuple[Path, str]:
    """(pid dir, text) of NAME in the mount namespace whose NFS mounts count.

    At /proc, our own (<procfs>/self). A procfs mounted elsewhere is a host's /proc seen from a
    container (--path.procfs=/host/proc), where `self` is still the container and its mounts, so
    the host's init (<procfs>/1) comes first there. Either way the other is tried when one fails.
    """
    order = ("self", "1") if procfs == Path("/proc") else ("1", "self")
    try:
        return procfs / order[0], (procfs / order[0] / name).read_text(errors="replace")
    except OSError:
        return procfs / order[1], (procfs / order[1] / name).read_text(errors="replace")


def read_mount_files(procfs: Path) -> tuple[str, str]:
    """mountstats and mountinfo of one mount namespace; mountinfo only adds server addresses."""
    pid_dir, stats = read_own_or_init(procfs, "mountstats")
    try:
        info = (pid_dir / "mountinfo").read_text(errors="replace")
    except OSError as err:
        log.debug("no mountinfo, server addresses from mountstats only: %s", err)
        info = ""
    return stats, info


@register
class NFSCollector(Collector):
    name = "nfs"
    description = "NFS client RPC time split (slot wait vs network+server), per mount and op."
    metrics = (OPERATIONS, TRANSMISSIONS, MAJOR_TIMEOUTS, MOUNT_MAJOR_TIMEOUTS, ERRORS, SENT_BYTES, RECEIVED_BYTES,
               QUEUE_SECONDS, RTT_SECONDS, EXECUTE_SECONDS,
               *(spec for spec, _ in _TRANSPORT_FIELDS), MOUNT_INFO, SLOT_TABLE_LIMIT, PARSE_ERRORS)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._parse_errors = 0
        self._reported: set[tuple[str, str]] = set()  # log each problem once, count it always
        nfs = ctx.config.nfs
        self._operations = None if nfs.operations == ("all",) else frozenset(nfs.operations)
        self._per_transport = nfs.per_transport
        self._transport_fields = [(spec, field) for spec, field in _TRANSPORT_FIELDS
                                  if nfs.transport_series == ("all",) or transport_series_name(spec)
                                  in nfs.transport_series]

    def collect(self) -> Iterator[Family]:
        stats_text, info_text = read_mount_files(self.ctx.procfs)
        stats = mountstats.parse(stats_text)
        addresses = mountinfo.nfs_server_addresses(info_text)
        for problem in stats.problems:
            if (problem.mountpoint, problem.reason) not in self._reported and len(self._reported) < 1000:
                self._reported.add((problem.mountpoint, problem.reason))
                log.warning("mountstats: skipped section %r at line %d: %s",
                            problem.mountpoint, problem.line, problem.reason)
        self._parse_errors += len(stats.problems)

        op_fams = {spec: spec.family() for spec in self.metrics if spec.labels == _OP}
        xprt_fams = {spec: spec.family() for spec, _ in self._transport_fields}
        info, mount_timeouts = MOUNT_INFO.family(), MOUNT_MAJOR_TIMEOUTS.family()
        seen: set[tuple[str, str]] = set()
        for mount in stats.mounts:
            key = (mount.mountpoint, mount.export)
            if key in seen:  # the same export stacked on one mountpoint
                continue
            seen.add(key)
            self._add_operations(op_fams, mount, self._operations)
            if mount.operations:  # no per-op block: no count, not 0
                mount_timeouts.add(key, sum(op.major_timeouts for op in mount.operations))
            for labels, values in self._transports(mount):
                for spec, field in self._transport_fields:
                    if field in values:
                        xprt_fams[spec].add((*key, *labels), values[field])
            protocol = mount.transports[0].protocol if mount.transports else mount.options.get("proto", "")
            address = addresses.get((mount.device, mount.mountpoint)) or mount.server_address
            device = self.ctx.route_lookup(address) if address else None
            info.add((*key, protocol, address, device or ""), 1)

        yield from op_fams.values()
        yield mount_timeouts
        yield from xprt_fams.values()
        yield info
        limits = SLOT_TABLE_LIMIT.family()
        for protocol, limit in read_slot_limits(self.ctx.procfs).items():
            limits.add((protocol,), limit)
        yield limits
        errors = PARSE_ERRORS.family()
        errors.add((), self._parse_errors)
        yield errors

    def _transports(self, mount: mountstats.NFSMount) -> Iterator[tuple[tuple[str, str], dict[str, int]]]:
        """((transport, protocol), xprt fields) for each transport, or by default one per protocol
        for all of the mount's transports: counters summed, max_slots the largest."""
        if self._per_transport:
            for index, xprt in enumerate(mount.transports):
                yield (str(index), xprt.protocol), xprt.values
            return
        merged: dict[str, dict[str, int]] = {}
        for xprt in mount.transports:
            into = merged.setdefault(xprt.protocol, {})
            for field, value in xprt.values.items():
                if field == "max_slots":
                    into[field] = max(into.get(field, 0), value)
                else:
                    into[field] = into.get(field, 0) + value
        for protocol, values in merged.items():
            yield ("all", protocol), values

    @staticmethod
    def _add_operations(fams: dict[MetricSpec, Family], mount: mountstats.NFSMount,
                        wanted: frozenset[str] | None) -> None:
        # The hot loop of a scrape (mounts x ops x 9): plain appends to the rows.
        ops, trans, timeouts = fams[OPERATIONS].rows, fams[TRANSMISSIONS].rows, fams[MAJOR_TIMEOUTS].rows
        sent, received, errors = fams[SENT_BYTES].rows, fams[RECEIVED_BYTES].rows, fams[ERRORS].rows
        queue, rtt, execute = fams[QUEUE_SECONDS].rows, fams[RTT_SECONDS].rows, fams[EXECUTE_SECONDS].rows
        wrapped = mountstats.WRAPPED_THRESHOLD
        rest = [op for op in mount.operations if wanted is not None and op.name not in wanted]
        served = mount.operations if not rest else [op for op in mount.operations if op.name in wanted]
        if rest:  # summed into one: counters stay counters, and the mount's totals stay whole
            _, *counts, failed = zip(*rest, strict=True)  # columns
            served.append(mountstats.Operation(
                "OTHER", *map(sum, counts), errors=None if None in failed else sum(failed)))
        for op in served:
            labels = (mount.mountpoint, mount.export, op.name)
            ops.append((labels, op.requests))
            trans.append((labels, op.transmissions))
            timeouts.append((labels, op.major_timeouts))
            sent.append((labels, op.sent_bytes))
            received.append((labels, op.received_bytes))
            if op.errors is not None:
                errors.append((labels, op.errors))
            # Old kernels wrap negative sums to near 2^64: such a value is no counter (nor a sum with one).
            if op.queue_ms < wrapped:
                queue.append((labels, op.queue_ms / 1000))
            if op.rtt_ms < wrapped:
                rtt.append((labels, op.rtt_ms / 1000))
            if op.execute_ms < wrapped:
                execute.append((labels, op.execute_ms / 1000))


def transport_series_name(spec: MetricSpec) -> str:
    """gpunode_nfs_transport_in_flight_sum_total -> in_flight_sum: the name nfs.transport_series uses."""
    return spec.name.removeprefix("gpunode_nfs_transport_").removesuffix("_total")
