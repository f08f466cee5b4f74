"""The pure mountstats parser, on real kernels' output and on broken input."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode_exporter.procfs import mountstats

REAL = Path(__file__).parent / "fixtures" / "mountstats-real"


def real(name: str) -> mountstats.MountStats:
    return mountstats.parse((REAL / name).read_text())


def nfs_section(*body: str, header: str = "device srv:/x mounted on /x with fstype nfs4 statvers=1.1") -> str:
    return "\n".join([header, *body]) + "\n"


def test_every_real_sample_parses_without_problems() -> None:
    for path in REAL.glob("*.txt"):
        assert mountstats.parse(path.read_text()).problems == [], path.name


def test_rhel8_9col_sample_has_errors_column_and_tcp_1_1_fields() -> None:
    stats = real("pcp-rhel8-4.18.0-105-nfs3-nfs40-41-42-tcp-9col.txt")
    assert [m.fstype for m in stats.mounts] == ["nfs4", "nfs4", "nfs4", "nfs"]
    mount = stats.mounts[0]
    assert all(op.errors is not None for op in mount.operations)
    assert set(mount.transports[0].values) == set(mountstats.TRANSPORT_FIELDS["tcp"])


def test_old_kernel_8col_ops_have_no_errors() -> None:
    stats = real("pcp-rhel8-4.18.0-80-nfs3-nfs40-41-42-tcp-8col.txt")
    assert stats.mounts and all(op.errors is None for m in stats.mounts for op in m.operations)


def test_statvers_1_0_tcp_line_lacks_max_slots() -> None:
    (mount,) = real("node_exporter571-nfs3-tcp-statvers1.0-wheezy-TRUNCATED.txt").mounts
    assert mount.statvers == "1.0"
    values = mount.transports[0].values
    assert values["sends"] == 403452500 and values["req_u"] == 659008617
    assert "max_slots" not in values


def test_rdma_nconnect_keeps_every_transport_line() -> None:
    (mount,) = real("node_exporter2749-nfs3-rdma-nconnect16-rhel9.1.txt").mounts
    assert len(mount.transports) == 16
    assert {t.protocol for t in mount.transports} == {"rdma"}
    assert "max_slots" not in mount.transports[0].values


def test_times_stay_in_milliseconds_and_wrapped_values_parse() -> None:
    (mount,) = real("procfs166-nfs4-queue-time-wrap-rhel7.3-FRAGMENT.txt").mounts
    access = mount.operations[0]
    assert access.name == "ACCESS"
    assert access.queue_ms == 18446743919241604546 >= mountstats.WRAPPED_THRESHOLD
    assert access.rtt_ms == 1667369447


def test_non_nfs_and_nfsd_mounts_are_skipped() -> None:
    assert real("pcp-no-nfs-mounts.txt").mounts == []
    stats = real("pcp-fedora24-nfs42-tcp-8col.txt")
    assert [m.mountpoint for m in stats.mounts] == ["/home"]


def test_escaped_mountpoint_is_decoded() -> None:
    text = nfs_section("\topts:\trw", header=(
        "device srv:/a\\040b mounted on /mnt/with\\040space\\011tab with fstype nfs statvers=1.1"))
    (mount,) = mountstats.parse(text).mounts
    assert mount.mountpoint == "/mnt/with space\ttab"
    assert mount.export == "srv:/a b"


@pytest.mark.parametrize(("options", "device", "want"), [
    ("rw,mountaddr=10.1.2.4,clientaddr=10.1.2.9", "srv:/x", "10.1.2.4"),
    ("rw", "srv:/x", "srv"),
    ("rw", "[fd00::1]:/x", "fd00::1"),
])
def test_server_address(options: str, device: str, want: str) -> None:
    text = nfs_section(f"\topts:\t{options}", header=f"device {device} mounted on /x with fstype nfs statvers=1.1")
    assert mountstats.parse(text).mounts[0].server_address == want


@pytest.mark.parametrize(("line", "fields"), [
    ("tcp 1 2 3 4 5 6 7 8 9 10", 10),
    ("tcp 1 2 3 4 5 6 7 8 9 10 11 12 13 14", 13),  # a future field is ignored
    ("udp 1 2 3 4 5 6 7", 7),
    ("udp 1 2 3 4 5 6 7 8 9 10", 10),
    ("local 1 2 3 4 5 6 7 8 9 10 11 12", 12),
    ("rdma " + " ".join(["1"] * 27), 10),
])
def test_transport_layouts(line: str, fields: int) -> None:
    assert len(mountstats.parse_transport(line).values) == fields


def test_idle_time_is_signed() -> None:
    # xs_tcp_print_stats prints idle_time with %ld; a clock step can make it negative.
    assert mountstats.parse_transport("tcp 1 2 3 4 -5 6 7 8 9 10").values["idle_time"] == -5


@pytest.mark.parametrize(("line", "reason"), [
    ("tcp 1 2 3", "want at least 10"),
    ("udp 1 2 3 4 5 6", "want at least 7"),
    ("quic 1 2 3", "unknown transport"),
    ("tcp 1 2 3 4 5 6 7 8 9 x", "not an unsigned 64-bit number"),
    ("tcp 1 2 3 -4 5 6 7 8 9 10", "not an unsigned 64-bit number"),  # connect_time is %lu
    ("tcp 1 2 3 4 5 +6 7 8 9 10", "not an unsigned 64-bit number"),
    ("tcp 1 2 3 4 5 6 7 8 9 1_000", "not an unsigned 64-bit number"),
    ("tcp 1 2 3 4 5 6 7 8 9 \u0661\u0662", "not an unsigned 64-bit number"),  # Arabic-Indic digits
    ("tcp 1 2 3 4 5 6 7 8 9 18446744073709551616", "not an unsigned 64-bit number"),  # 2**64
    ("", "empty"),
])
def test_bad_transport_lines(line: str, reason: str) -> None:
    with pytest.raises(mountstats.MountStatsError, match=reason):
        mountstats.parse_transport(line)


@pytest.mark.parametrize(("line", "reason"), [
    ("READ: 1 2 3", "want 8 or 9"),
    ("READ: 1 2 3 4 5 6 7 -", "not an unsigned 64-bit number"),
    ("READ: 1 2 3 4 5 -100000000000000000000000000000 7 8", "not an unsigned 64-bit number"),
    ("READ: 1 2 3 4 5 6 7 18446744073709551616", "past 2\\*\\*64"),
    ("READ: 1 2 3 4 5 6 7 " + "9" * 400, "not an unsigned 64-bit number"),
    ("READ: 1 2 3 4 5 6 7 1_000", "not an unsigned 64-bit number"),
    ("READ: 1 2 3 4 5 6 7 +8", "not an unsigned 64-bit number"),
    ("READ: 1 2 3 4 5 6 7 \u0668", "not an unsigned 64-bit number"),
    ("READ 1 2 3 4 5 6 7 8", "without 'NAME:'"),
])
def test_bad_operation_lines(line: str, reason: str) -> None:
    with pytest.raises(mountstats.MountStatsError, match=reason):
        mountstats.parse_operation(line)


@pytest.mark.parametrize("name", ["READ", "RE\x1cAD", "RE\xa0AD", "RE AD", "OPEN_NOATTR"])
@pytest.mark.parametrize("numbers", ["1 2 3 4 5 6 7 8 9", "1 2 3 4 5 6 7 8", "1 2 3 4 5 6 7 8 18446744073709551616"])
def test_operations_in_bulk_are_parsed_as_line_by_line(name: str, numbers: str) -> None:
    # A block of kernel-shaped lines is parsed a column at a time; a name str.split() would cut
    # in two (non-ASCII or control whitespace), an old kernel's 8 numbers or a number past 64
    # bits send it to the line parser.
    lines = [f"\t{name}: {numbers}", "\t        WRITE: 10 10 0 4 5 6 7 8 0"]
    try:
        expected: object = [mountstats.parse_operation(line) for line in lines]
    except mountstats.MountStatsError as err:
        expected = str(err)
    try:
        got: object = mountstats.parse_operations(lines)
    except mountstats.MountStatsError as err:
        got = str(err)
    assert got == expected


def test_malformed_section_is_dropped_and_the_rest_kept() -> None:
    good = nfs_section("\txprt:\ttcp 1 0 1 0 0 5 5 0 5 0 1 0 5", "\tper-op statistics",
                       "\t        READ: 1 1 0 1 1 1 1 1 0")
    bad = nfs_section("\tper-op statistics", "\t        READ: 1 1 0 1 1 garbage 1 1 0",
                      header="device srv:/bad mounted on /bad with fstype nfs4 statvers=1.1")
    stats = mountstats.parse("\x00\xff binary junk\n" + bad + good)
    assert [m.mountpoint for m in stats.mounts] == ["/x"]
    assert [(p.mountpoint, p.line) for p in stats.problems] == [("", 1), ("/bad", 2)]


def test_section_cut_short_mid_line_is_dropped() -> None:
    text = nfs_section("\tper-op statistics", "\t        NULL: 1 1 0 44 24 0 0 0 0") + "\t       WRITE: 12 12"
    stats = mountstats.parse(text)
    assert stats.mounts == [] and "want 8 or 9" in stats.problems[0].reason


def test_unknown_lines_and_ops_are_kept_quietly() -> None:
    text = nfs_section("\tfuture:\t1 2 3", "\tper-op statistics",
                       "\tBRAND_NEW_OP: 1 1 0 1 1 1 1 1 0", header=(
                           "device s:/x mounted on /x with fstype nfs4 statvers=1.2"))
    stats = mountstats.parse(text)
    assert stats.problems == [] and stats.mounts[0].operations[0].name == "BRAND_NEW_OP"


def test_empty_input() -> None:
    assert mountstats.parse("") == mountstats.MountStats([], [])


def test_any_truncation_of_real_output_parses_without_raising() -> None:
    """Input cut at any byte (a broken fixture, a copy cut short): never an exception,
    never a mount invented. The kernel itself emits whole mount sections (seq_file
    records), so a vanishing mount drops out whole; this is the harsher case."""
    text = (REAL / "pcp-rhel8-4.18.0-105-nfs3-nfs40-41-42-tcp-9col.txt").read_text()
    whole = {m.mountpoint: m for m in mountstats.parse(text).mounts}
    start = text.index("device rhel8")
    for cut in range(start, len(text), 7):
        stats = mountstats.parse(text[:cut])
        for mount in stats.mounts:
            assert mount.mountpoint in whole
            full = whole[mount.mountpoint]
            # a kept mount is complete, or cut between lines: its ops are a prefix of the whole
            assert [o.name for o in mount.operations] == [o.name for o in full.operations][: len(mount.operations)]
            # all but the last, which a cut inside its final number may shorten
            kept = full.operations[: max(0, len(mount.operations) - 1)]
            assert mount.operations[: len(kept)] == kept
