"""Every parser of untrusted input, fed what hypothesis makes of it: each returns a valid result or
raises its own parse error, never anything else, and never a negative or out-of-type counter.

Inputs are real lines with their numbers and names swapped for hostile ones (signs, "_",
Unicode digits, hundreds of digits, bytes that are not UTF-8), and raw bytes besides.
EXAMPLES examples per parser (README.md: how many CI runs).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import re
import struct
import tempfile
from pathlib import Path

import pynvml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpunode_rulepack
from gpunode_common import webconfig
from gpunode_common.config import ConfigError
from gpunode_exporter import numbers
from gpunode_exporter.collector import gpu_straggler
from gpunode_exporter.ethtool import pfc_pause_frames
from gpunode_exporter.gpu_processes import ProcessTracker
from gpunode_exporter.kmsg import parse_record
from gpunode_exporter.nvml import Device, GPULostError, Session
from gpunode_exporter.procfs import cgroup, mountinfo, mountstats, pid
from gpunode_exporter.procfs.pid import IO
from gpunode_exporter.sysfs import net
from gpunode_exporter.xid import state as statefile
from gpunode_exporter.xid.kernel import KINDS, MAX_DEVICE, SXidEvent, parse_event
from gpunode_exporter.xid.parse import parse_xid
from tests.fakeproc import STAT, FakeProc

EXAMPLES = 300
FIXTURES = Path(__file__).parent / "fixtures"
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Numbers as a hostile kernel line might print them.
WEIRD_NUMBERS = st.one_of(
    st.integers(min_value=-(10 ** 30), max_value=10 ** 30).map(str),
    st.sampled_from(["+7", " 7", "1_000", "\u0661\u0662", "\u0968", "\uff17", "0x10", "1e3", "-0", "", "nan",
                     str(numbers.U64_MAX), str(numbers.U64_MAX + 1), str(numbers.S64_MIN), "9" * 400, "7" * 5000]),
)
NAMES = st.one_of(st.text(max_size=20), st.binary(max_size=20).map(lambda b: b.decode("utf-8", "surrogateescape")))


def _mutate(lines: list[str], data: st.DataObject) -> str:
    """Real lines with some of their numbers (and words) replaced."""
    out = []
    for line in lines:
        words = line.split(" ")
        for i in data.draw(st.lists(st.integers(0, max(0, len(words) - 1)), max_size=3)):
            words[i] = data.draw(st.one_of(WEIRD_NUMBERS, NAMES))
        out.append(" ".join(words))
    return "\n".join(out)


def _in_u64(value: int) -> bool:
    return isinstance(value, int) and 0 <= value <= numbers.U64_MAX


# --- numbers --------------------------------------------------------------------------

@SETTINGS
@given(st.one_of(WEIRD_NUMBERS, st.binary(max_size=30).map(lambda b: b.decode("latin-1"))))
def test_kernel_numbers(text: str) -> None:
    for parse, low, high in ((numbers.u64, 0, numbers.U64_MAX), (numbers.s64, numbers.S64_MIN, numbers.S64_MAX)):
        try:
            value = parse(text)
        except numbers.KernelNumberError:
            continue
        assert low <= value <= high
        assert re.fullmatch("-?[0-9]+" if parse is numbers.s64 else "[0-9]+", text, re.ASCII)


# --- nvmlDeviceGetFieldValues answers (the driver's bytes) ----------------------------------

class _Driver(Session):
    """Answers every call with these nvmlFieldValue_t bytes, as a driver with any values might."""

    def __init__(self, answer: bytes) -> None:
        super().__init__()
        self.answer = answer

    def read(self, device: Device, fn: object, *args: object, sticky: bool = False) -> object:
        ctypes.memmove(args[0], self.answer, len(self.answer))
        return args[0]


_RETURNS = st.sampled_from([pynvml.NVML_SUCCESS] * 4 + [
    pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_GPU_IS_LOST, -1, 2 ** 31 - 1])
_RAW = st.one_of(st.integers(0, 2 ** 64 - 1), st.sampled_from([  # NOT_AVAILABLE, negatives, +-inf and NaN as doubles
    0, 1, 2 ** 64 - 1, 2 ** 32 - 1, 2 ** 63, 0x7FF0000000000000, 0x7FF8000000000000, 0xFFF0000000000000]))


@SETTINGS
@given(st.integers(-2, 9), _RAW)
def test_field_value_decode(value_type: int, raw: int) -> None:
    value = gpu_straggler.decode(value_type, raw)
    assert value is None or (value >= 0 and math.isfinite(value))


@SETTINGS
@given(st.data())
def test_field_values_answers(data: st.DataObject) -> None:
    links = data.draw(st.integers(0, 3))
    plan = gpu_straggler.Fields.plan(links)
    if data.draw(st.booleans()):
        plan = plan.settle(set(data.draw(st.lists(st.integers(0, len(plan.ids) - 1)))))
    usual = data.draw(st.booleans())  # every field answered in the types expected: the fast path
    answer = b"".join(struct.pack("=" + gpu_straggler.FIELD_FORMAT, fid, scope, 0, 0,
                                  kind if usual else data.draw(st.integers(-2, 9)),
                                  pynvml.NVML_SUCCESS if usual else data.draw(_RETURNS), data.draw(_RAW))
                      for (fid, scope), kind in zip(plan.ids, plan.types, strict=True))
    reads = gpu_straggler.StragglerReads(_Driver(answer), per_link=data.draw(st.booleans()))
    device, out, ids = Device(0), gpu_straggler.Reading(), ("0", "GPU-x")
    try:
        reads._read_fields(device, plan, gpu_straggler._Labels(ids), out)
    except GPULostError:
        returns = struct.unpack("=" + gpu_straggler.FIELD_FORMAT * len(plan.ids), answer)[5::7]
        assert device.lost and pynvml.NVML_ERROR_GPU_IS_LOST in returns
        return
    assert out.events == []
    for rows in (out.violations, out.errors, out.up, out.replays):  # one value each, a count
        assert len(rows) == len({labels for labels, _ in rows})
        assert all(v >= 0 and math.isfinite(v) for _, v in rows)
    assert {labels[2] for labels, _ in out.violations} <= {p for p, _ in gpu_straggler.POLICIES}
    assert all(labels == ids and v <= links for labels, v in out.up)
    assert all(labels == ids and v < 2 ** 64 - 1 for labels, v in out.replays)
    for (_, _, link, kind), _ in out.errors:
        assert kind in ("replay", "recovery", "crc_flit") and (link == "all" or 0 <= int(link) < links)


# --- /proc/PID/mountstats --------------------------------------------------------------

_MOUNTSTATS = (FIXTURES / "procfs" / "real" / "self" / "mountstats").read_text().splitlines()


@SETTINGS
@given(st.data())
def test_mountstats(data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(_MOUNTSTATS) - 1))
    text = _mutate(_MOUNTSTATS[start:start + data.draw(st.integers(1, 120))], data)
    parsed = mountstats.parse(text)  # never raises: a bad section is a problem, not an exception
    for mount in parsed.mounts:
        for op in mount.operations:
            counts = [op.requests, op.transmissions, op.major_timeouts, op.sent_bytes, op.received_bytes,
                      op.queue_ms, op.rtt_ms, op.execute_ms] + ([op.errors] if op.errors is not None else [])
            assert all(map(_in_u64, counts))
        for xprt in mount.transports:
            for name, value in xprt.values.items():
                assert (numbers.S64_MIN <= value <= numbers.S64_MAX) if name == "idle_time" else _in_u64(value)


_OP_LINES = [line for line in _MOUNTSTATS if re.match(r"\s+[A-Z_0-9]+: [0-9 ]+$", line)]
_XPRT_LINES = [line.split("xprt:", 1)[1] for line in _MOUNTSTATS if line.strip().startswith("xprt:")]


def _outcome(parse, *args):  # type: ignore[no-untyped-def]
    try:
        return parse(*args)
    except mountstats.MountStatsError:
        return "refused"


@SETTINGS
@given(st.data())
def test_mountstats_operations_in_bulk_as_line_by_line(data: st.DataObject) -> None:
    # The bulk parser takes a block whole or hands it to the line parser: the result is the same.
    lines = data.draw(st.lists(st.sampled_from(_OP_LINES), max_size=70))
    lines = _mutate(lines, data).split("\n") if lines else []
    lines = [line for line in lines if line.strip()]
    one_by_one = _outcome(lambda: [mountstats.parse_operation(line) for line in lines])
    assert _outcome(mountstats.parse_operations, lines) == one_by_one


@SETTINGS
@given(st.data())
def test_mountstats_transport_as_field_by_field(data: st.DataObject) -> None:
    rest = _mutate([data.draw(st.sampled_from(_XPRT_LINES))], data)
    parts = rest.split()
    names = mountstats.TRANSPORT_FIELDS.get(parts[0] if parts else "", ())
    try:  # every field checked as the C type the kernel printed it from
        nums = [numbers.s64(text) if name == "idle_time" else numbers.u64(text)
                for name, text in zip(names, parts[1:], strict=False)]
        nums += [numbers.u64(text) for text in parts[1 + len(names):]]  # newer kernels' extra fields
        expected = dict(zip(names, nums, strict=False)) if len(nums) > names.index("bklog_u") else "refused"
    except (numbers.KernelNumberError, ValueError):  # ValueError: an unknown transport has no bklog_u
        expected = "refused"
    parsed = _outcome(mountstats.parse_transport, rest)
    assert (parsed if parsed == "refused" else parsed.values) == expected


@SETTINGS
@given(st.text(max_size=400))
def test_mountstats_any_text(text: str) -> None:
    assert isinstance(mountstats.parse(text), mountstats.MountStats)


@SETTINGS
@given(st.data())
def test_mountinfo(data: st.DataObject) -> None:
    line = ("36 35 0:41 / /mnt/data rw,relatime shared:1 - nfs4 srv:/export "
            "rw,vers=4.2,addr=10.0.0.5,clientaddr=10.0.0.9")
    text = _mutate([line, data.draw(st.text(max_size=80))], data)
    for key, address in mountinfo.nfs_server_addresses(text).items():
        assert all(isinstance(part, str) for part in (*key, address))


# --- /dev/kmsg and Xid lines ------------------------------------------------------------

_KMSG = (FIXTURES / "kmsg" / "real-xid.kmsg").read_text().splitlines()


@SETTINGS
@given(st.data())
def test_kmsg_records_and_xid_lines(data: st.DataObject) -> None:
    line = data.draw(st.sampled_from(_KMSG))
    head, _, text = line.partition(";")
    fields = head.split(",")
    for i in data.draw(st.lists(st.integers(0, len(fields) - 1), max_size=2)):
        fields[i] = data.draw(WEIRD_NUMBERS)
    words = text.split(" ")
    for i in data.draw(st.lists(st.integers(0, len(words) - 1), max_size=3)):
        words[i] = data.draw(st.one_of(WEIRD_NUMBERS, NAMES, WEIRD_NUMBERS.map(lambda n: n + ",")))
    raw = (",".join(fields) + ";" + " ".join(words)).encode("utf-8", "surrogateescape")
    try:
        record = parse_record(raw)
    except ValueError:
        return
    assert _in_u64(record.seq) and _in_u64(record.usec) and record.facility >= 0 and 0 <= record.level <= 7
    try:
        event = parse_xid(" ".join(words))
    except numbers.KernelNumberError:
        return
    if event is not None:
        assert 0 <= event.xid <= numbers.U32_MAX
        for value in (event.pid, event.gpu_instance, event.compute_instance, event.recovery_action):
            assert value is None or 0 <= value <= numbers.U32_MAX


@SETTINGS
@given(st.binary(max_size=200))
def test_kmsg_any_bytes(raw: bytes) -> None:
    try:
        record = parse_record(raw)
    except ValueError:
        return
    assert _in_u64(record.seq) and _in_u64(record.usec)


_EVENTS = [line.partition(";")[2] for name in ("real-kernel-events", "real-xid")
           for line in (FIXTURES / "kmsg" / f"{name}.kmsg").read_text().splitlines()]


def _check_event(text: str) -> None:
    try:
        event = parse_event(text)
    except ValueError:  # KernelNumberError or DeviceError: that record alone
        return
    if isinstance(event, SXidEvent):
        assert 0 <= event.switch <= numbers.U32_MAX and 0 <= event.sxid <= numbers.U32_MAX
        assert event.severity in (None, "fatal", "nonfatal")
    elif event is not None:
        assert event.kind in KINDS and len(event.device) <= MAX_DEVICE
        assert not any(c.isspace() for c in event.device)


@SETTINGS
@given(st.data())
def test_kernel_event_lines(data: st.DataObject) -> None:
    """Real SXid and kernel event lines with words swapped: an event of a known kind with a bounded
    device, or nothing, or the parse error of that one line."""
    line = data.draw(st.sampled_from(_EVENTS))
    words = line.split(" ")
    for i in data.draw(st.lists(st.integers(0, len(words) - 1), max_size=3)):
        words[i] = data.draw(st.one_of(WEIRD_NUMBERS, NAMES, st.text(max_size=300)))
    _check_event(" ".join(words))


@SETTINGS
@given(st.binary(max_size=300))
def test_kernel_event_any_bytes(raw: bytes) -> None:
    _check_event(raw.decode("utf-8", "replace"))


_RECORDS = (FIXTURES / "kmsg" / "real-kernel-events.kmsg").read_bytes().splitlines()


def _totals(raws: list[bytes]) -> int:
    from gpunode_exporter.nvml import Session
    from gpunode_exporter.xid.gpus import GpuDirectory
    from gpunode_exporter.xid.tracker import XidTracker
    session = Session()
    t = XidTracker(Path("/nonexistent"), None, False, Path("/nonexistent"),
                   GpuDirectory(session, Path("/nonexistent"), Path("/nonexistent")), session)
    t._handle(raws)
    return sum(c.value for c in (*t.state.kernel.values(), *t.state.sxids.values()))


@settings(max_examples=EXAMPLES // 10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(_RECORDS) - 1), st.binary(max_size=120))
def test_a_bad_record_costs_that_record_alone(at: int, garbage: bytes) -> None:
    """One record's text replaced by anything: the others' events all counted, none twice."""
    whole = _totals(_RECORDS)
    head = _RECORDS[at].partition(b";")[0]
    changed = [*_RECORDS[:at], head + b";" + garbage.replace(b"\n", b""), *_RECORDS[at + 1:]]
    assert whole - 1 <= _totals(changed) <= whole


# --- /proc/PID/stat, io, uptime, cgroup -------------------------------------------------------

_STAT = (b"77 (python3 (train)) R 12 2176 24769 0 -1 4194304 2859 6532 6 1 4 1 4 2 20 0 1 0 98765 "
         b"16965632 3380 18446744073709551615 94574818803712 0\n")


@SETTINGS
@given(st.data())
def test_proc_stat(data: st.DataObject) -> None:
    words = _STAT.split(b" ")
    for i in data.draw(st.lists(st.integers(0, len(words) - 1), max_size=3)):
        words[i] = data.draw(st.one_of(WEIRD_NUMBERS.map(str.encode), st.binary(max_size=12)))
    try:
        stat = pid.parse_stat(b" ".join(words))
    except pid.PidFileError:
        return
    assert _in_u64(stat.ppid) and _in_u64(stat.start_ticks)


_IO_KEYS = (b"rchar", b"wchar", b"syscr", b"syscw", b"read_bytes", b"write_bytes", b"cancelled_write_bytes")
_IO_VALUES = st.one_of(st.just(b"7"), WEIRD_NUMBERS.map(str.encode), st.binary(max_size=10))


def _io_file(data: st.DataObject) -> bytes:
    """/proc/PID/io with hostile values and maybe a line left out; now and then any bytes."""
    if data.draw(st.integers(0, 3)) == 0:
        return data.draw(st.binary(max_size=300))
    lines = [key + b": " + data.draw(_IO_VALUES) + b"\n" for key in _IO_KEYS]
    dropped = data.draw(st.sets(st.integers(0, len(lines) - 1), max_size=1))
    return b"".join(line for i, line in enumerate(lines) if i not in dropped)


def _stat_file(data: st.DataObject) -> bytes:
    words = STAT.format(pid=11, ppid=1, start=9).encode().split(b" ")
    for i in data.draw(st.lists(st.integers(0, len(words) - 1), max_size=3)):
        words[i] = data.draw(st.one_of(WEIRD_NUMBERS.map(str.encode), st.binary(max_size=12)))
    return b" ".join(words) if data.draw(st.booleans()) else data.draw(st.binary(max_size=300))


@SETTINGS
@given(st.data())
def test_gpu_process_stat_and_io_as_psutil_reads_them(data: st.DataObject) -> None:
    """A GPU process's stat and io, hostile, read by psutil through the tracker on a procfs tree:
    no scan raises, its neighbour still counts, no counter goes negative or past u64, totals never go back."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = FakeProc(Path(tmp))
        proc.spawn(10, gpu=True, io=(1000, 100, 10, 1))
        proc.spawn(11, gpu=True, io=(7, 7, 7, 7))
        tracker = ProcessTracker(proc.root)
        last = IO()
        for _ in range(3):
            (proc.root / "11" / "io").write_bytes(_io_file(data))
            if data.draw(st.booleans()):
                (proc.root / "11" / "stat").write_bytes(_stat_file(data))
            totals = tracker.scan().totals
            for io in [p.io for p in tracker._gpu.values() if p.io is not None]:
                assert all(map(_in_u64, (io.rchar, io.wchar, io.syscr, io.syscw))), io
            assert totals.rchar >= 1000 and totals == totals.at_least(last)
            last = totals


@SETTINGS
@given(st.one_of(st.binary(max_size=40), st.tuples(WEIRD_NUMBERS, WEIRD_NUMBERS).map(
    lambda t: f"{t[0]}.{t[1]} 5.00\n".encode())))
def test_proc_uptime(data: bytes) -> None:
    try:
        seconds = pid.parse_uptime(data)
    except pid.PidFileError:
        return
    assert math.isfinite(seconds) and seconds >= 0


@SETTINGS
@given(st.binary(max_size=200))
def test_proc_cgroup(data: bytes) -> None:
    try:
        paths = cgroup.parse_cgroup(data)
    except cgroup.CgroupFileError:
        return
    for path in paths:
        path.encode("utf-8")  # valid for a label value


# --- sysfs and ethtool counters -----------------------------------------------------------

@SETTINGS
@given(st.dictionaries(st.sampled_from(["np_cnp_sent", "rp_cnp_handled", "out_of_buffer", "lifespan"]),
                       st.one_of(WEIRD_NUMBERS.map(str.encode), st.binary(max_size=12)), max_size=4))
def test_sysfs_counters(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        for name, content in files.items():
            (Path(directory) / name).write_bytes(content)
        counters, malformed = net._hw_counters(Path(directory))
    assert all(map(_in_u64, counters.values())) and len(counters) + malformed <= len(files)
    assert "lifespan" not in counters


@SETTINGS
@given(st.dictionaries(st.one_of(st.text(max_size=30), st.sampled_from(
    ["rx_prio3_pause", "tx_prio0_pause", "rx_pause_ctrl_phy", "tx_global_pause", "rx_prio9_pause"])),
    st.integers(0, numbers.U64_MAX), max_size=10))
def test_ethtool_pfc(stats: dict[str, int]) -> None:
    for (direction, priority), frames in pfc_pause_frames(stats).items():
        assert direction in ("rx", "tx") and _in_u64(frames)
        priority.encode("utf-8")


# --- files the exporter reads: the Xid state, the web config, the rule spec -------------------

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
              st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20)
_GOOD_STATE = {"version": 1, "boot_id": "b", "source": "kmsg", "kmsg_seq": 3, "records_lost": 0,
               "gpus": {"0000:1b:00.0": {"gpu": "0", "uuid": "GPU-1"}},
               "xids": [{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": 2, "last": 1.5e9}], "recovery": {},
               "sxids": [{"switch": 1, "pci_bus_id": "0000:06:00.0", "sxid": 20034, "severity": "fatal",
                          "count": 1, "last": 1.5e9}],
               "kernel_events": [{"kind": "oom_kill", "device": "", "count": 3, "last": 1.5e9}],
               "nfs_servers": {"nfs1": 0}}


@SETTINGS
@given(st.data())
def test_state_file(data: st.DataObject) -> None:
    state = json.loads(json.dumps(_GOOD_STATE))
    # Replace a value somewhere in a good state with anything JSON can hold.
    node: dict | list = state
    while True:
        key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        child = node[key]  # type: ignore[index]
        if isinstance(child, dict | list) and child and data.draw(st.booleans()):
            node = child
            continue
        node[key] = data.draw(JSON)  # type: ignore[index]
        break
    text = json.dumps(state, allow_nan=True) if data.draw(st.booleans()) else data.draw(st.text(max_size=200))
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / statefile.FILE_NAME
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        loaded, problem = statefile.load(path, "b")
    assert (problem is None) or loaded == statefile.State("b")
    assert loaded.kmsg_seq is None or _in_u64(loaded.kmsg_seq)
    for count in loaded.counts.values():
        assert _in_u64(count.value) and math.isfinite(count.last_seconds) and count.last_seconds >= 0
    for value in (*loaded.gpus, *(part for ids in loaded.gpus.values() for part in ids)):
        value.encode("utf-8")
    for count in (*loaded.sxids.values(), *loaded.kernel.values()):
        assert _in_u64(count.value) and math.isfinite(count.last_seconds) and count.last_seconds >= 0
    assert all(up in (0, 1) for up in loaded.nfs_servers.values())


YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=3)),
    max_leaves=10)


@SETTINGS
@given(st.one_of(
    st.fixed_dictionaries({}, optional={"basic_auth_users": YAML_VALUES, "http_server_config": YAML_VALUES,
                                        "tls_server_config": YAML_VALUES}),
    YAML_VALUES))
def test_web_config(data: object) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "web.yml"
        path.write_text(json.dumps(data))  # JSON is YAML
        with contextlib.suppress(ConfigError):
            webconfig.load(path)


_SPEC = gpunode_rulepack.shipped_spec()


def _spec_override(data: st.DataObject) -> dict:
    """A path of the shipped spec's keys, ending in any value."""
    override: dict = {}
    node, base = override, _SPEC
    while True:
        key = data.draw(st.sampled_from(sorted(base)))
        if isinstance(base[key], dict) and data.draw(st.booleans()):
            node = node.setdefault(key, {})
            base = base[key]
            continue
        node[key] = data.draw(YAML_VALUES)
        return override


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rule_spec(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "spec.yaml"
        path.write_text(json.dumps(_spec_override(data)))
        with contextlib.suppress(ConfigError):
            gpunode_rulepack.render(gpunode_rulepack.load_spec(path))
