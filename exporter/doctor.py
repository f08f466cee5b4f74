"""`gpunode-exporter doctor`: this node as each collector will see it, and what to fix.

Each check reads what its collector reads, with the same paths, config and privileges, and
says what it found. A `fail` means an enabled collector cannot work (exit status 1); `warn`
means it works with less than it could.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpunode_common import webconfig
from gpunode_exporter import collectors, config
from gpunode_exporter.collector import Context
from gpunode_exporter.collector.checkpoint import written_bytes
from gpunode_exporter.collector.nfs import read_mount_files, read_own_or_init
from gpunode_exporter.collector.storage_network import storage_interfaces
from gpunode_exporter.ethtool import Ethtool
from gpunode_exporter.kmsg import KmsgReader
from gpunode_exporter.procfs import mountstats
from gpunode_exporter.sysfs import net, pci

OK, WARN, FAIL, OFF = "ok", "warn", "fail", "off"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # OK, WARN, FAIL, or OFF (its collector is disabled)
    seen: str
    fix: str = ""


def _nvml(ctx: Context) -> Iterator[Finding]:
    import pynvml

    try:
        devices = ctx.nvml.devices()
    except pynvml.NVMLError as err:
        name = type(err).__name__.removeprefix("NVMLError_")
        fixes = {
            "LibraryNotFound": "install NVIDIA's driver (it brings libnvidia-ml.so.1); on a node without NVIDIA "
                               "GPUs, run with --no-collector.gpu",
            "DriverNotLoaded": "load the driver (modprobe nvidia; dmesg | grep NVRM says why it did not load)",
            "NoPermission": "let the exporter's user open /dev/nvidiactl and /dev/nvidia* (the unit's DeviceAllow=)",
            "LibRmVersionMismatch": "the driver was upgraded under the loaded module: reboot, or reload the module",
        }
        yield Finding("nvml", FAIL, f"NVML does not start: {name}", fixes.get(name, "see dmesg | grep NVRM"))
        return
    yield Finding("nvml", OK, f"driver {ctx.nvml.driver_version or '(version unknown)'}, {len(devices)} GPUs")
    on_bus = len(pci.nvidia_gpus(ctx.sysfs))
    expected = ctx.config.gpu.expected_count
    seen = f"NVML {len(devices)}, PCI bus {on_bus}" + (f", expected {expected}" if expected is not None else "")
    if on_bus != len(devices) or (expected is not None and len(devices) != expected):
        yield Finding("gpus", WARN, seen, "a GPU the driver did not take, or one that fell off the bus: "
                      "dmesg | grep NVRM, lspci -d 10de:")
    else:
        yield Finding("gpus", OK, seen)


def _kmsg(ctx: Context, nvml_works: bool) -> Iterator[Finding]:
    try:
        reader = KmsgReader(ctx.kmsg)
        try:
            reader.read(max_records=1)
        finally:
            reader.close()
    except OSError as err:
        fallback = ("Xids are counted from NVML events instead: none from before the exporter started, "
                    "and not those NVML does not report (Xid 79)" if nvml_works else "nor can NVML report Xids")
        grant = ("grant CAP_SYSLOG (the unit's AmbientCapabilities=) or run as root"
                 if isinstance(err, PermissionError) else f"check --path.kmsg ({ctx.kmsg})")
        yield Finding("kmsg", WARN if nvml_works else FAIL, f"{ctx.kmsg}: {err.strerror}; {fallback}", grant)
        return
    yield Finding("kmsg", OK, f"{ctx.kmsg} readable")


def _state(ctx: Context) -> Iterator[Finding]:
    directory = ctx.state_dir
    if directory is None:
        return
    existing = directory
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise NotADirectoryError(0, "not a directory")
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".doctor-"):
            pass
    except OSError as err:
        yield Finding("state", FAIL, f"{existing}: {err.strerror or err}; Xid counts would not survive a restart",
                      f"make {directory} a directory the exporter's user can write (the unit's StateDirectory=, "
                      "or the tmpfiles file), or point --path.state elsewhere")
        return
    yield Finding("state", OK, f"{directory} writable" + ("" if directory.exists() else " (will be created)"))


def _nfs(ctx: Context) -> Iterator[Finding]:
    try:
        stats, _info = read_mount_files(ctx.procfs)
    except OSError as err:
        yield Finding("nfs", FAIL, f"mountstats: {err.strerror or err}",
                      f"mount procfs at --path.procfs ({ctx.procfs}); in a container, the host's /proc")
        return
    parsed = mountstats.parse(stats)
    if not parsed.mounts:
        yield Finding("nfs", OK, "no NFS mounts: the nfs collector serves nothing until one appears")
    for mount in parsed.mounts:
        yield Finding("nfs", OK, f"{mount.mountpoint} ({mount.export}, {mount.fstype}, mountstats "
                      f"v{mount.statvers}, {len(mount.operations)} operations)")
    for problem in parsed.problems[:5]:
        yield Finding("nfs", WARN, f"{problem.mountpoint} line {problem.line}: {problem.reason}",
                      "counted in gpunode_nfs_parse_errors_total; the rest of the mount is served")


def _checkpoint(ctx: Context) -> Iterator[Finding]:
    c = ctx.config.checkpoint
    try:
        _pid, text = read_own_or_init(ctx.procfs, "mountstats")
    except OSError as err:
        yield Finding("checkpoint", FAIL, f"mountstats: {err.strerror or err}",
                      f"mount procfs at --path.procfs ({ctx.procfs}); in a container, the host's /proc")
        return
    counted = written_bytes(text, [re.compile(p) for p in c.mountpoints])
    every = f"WRITE over {c.save_write_bytes / 1e6:g} MB/s, read every {c.sample_seconds:g} s"
    if counted:
        yield Finding("checkpoint", OK, f"times saves to {', '.join(sorted({m for m, _ in counted}))} ({every})")
    elif c.mountpoints:
        yield Finding("checkpoint", WARN, f"no NFS mount matches checkpoint.mountpoints {list(c.mountpoints)}",
                      "fix checkpoint.mountpoints in --config.file: no save is timed until one matches")
    else:
        yield Finding("checkpoint", OK, f"no NFS mounts: no save is timed until one appears ({every})")


def _storage(ctx: Context) -> Iterator[Finding]:
    devices = storage_interfaces(ctx)
    if not devices:
        yield Finding("storage", OK, "no storage interfaces (no route to an NFS server, none in storage.interfaces)")
    ports = net.rdma_ports(ctx.sysfs, ())
    ethtool = Ethtool()
    try:
        for device, source in devices.items():
            speed = net.link_speed_bytes(ctx.sysfs, device)
            rdma = [f"{p.device}/{p.port}" for p in ports if p.netdev == device]
            try:
                pfc = sum(1 for name in ethtool.stats(device) if "pause" in name.lower())
                counters = f"ethtool -S: {pfc} pause counters"
            except OSError as err:
                counters = f"ethtool -S: {err.strerror or err}"
            seen = (f"{device} ({source}): link speed {'unknown' if speed is None else f'{speed * 8 / 1e9:g} Gb/s'}, "
                    f"RDMA ports {', '.join(rdma) or 'none'}, {counters}")
            if speed is None and not (ctx.sysfs / "class" / "net" / device).exists():
                yield Finding("storage", WARN, seen, f"no interface {device}: check storage.interfaces")
            else:
                yield Finding("storage", OK, seen)
    finally:
        ethtool.close()


# CAP_DAC_READ_SEARCH opens other users' /proc/PID/fd; CAP_SYS_PTRACE reads their io.
_CAPABILITIES = {"CAP_DAC_READ_SEARCH": 2, "CAP_SYS_PTRACE": 19}


def _missing_capabilities() -> list[str]:
    # Our own process, so the real /proc whatever --path.procfs says.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
            return [name for name, bit in _CAPABILITIES.items() if not effective >> bit & 1]
    return list(_CAPABILITIES)


def _gpu_processes(ctx: Context) -> Iterator[Finding]:
    own = {str(os.getpid()), "self", "thread-self"}
    pids = [p for p in os.listdir(ctx.procfs) if p.isdigit() and p not in own][:200]
    denied = 0
    for pid in pids:
        try:
            os.listdir(ctx.procfs / pid / "fd")
            (ctx.procfs / pid / "io").read_bytes()
        except PermissionError:
            denied += 1
        except OSError:
            pass  # the process ended
    missing = _missing_capabilities()
    seen = f"{len(pids) - denied} of {len(pids)} other processes' fd and io readable"
    if not pids:
        yield Finding("gpu_processes", WARN, f"no process in {ctx.procfs}", "mount the host's /proc; in a "
                      "container, also share the host's PID namespace (hostPID)")
    elif missing:
        yield Finding("gpu_processes", FAIL, f"{seen}; without {' and '.join(missing)}, other users' GPU "
                      "processes go unseen", f"grant {' and '.join(missing)} (the unit's AmbientCapabilities=), "
                      "or run as root")
    else:
        # With both capabilities, what stays unreadable is another user namespace's (a sandbox's) processes.
        yield Finding("gpu_processes", OK, seen)


def _staging(ctx: Context) -> Iterator[Finding]:
    for path in ctx.config.staging.paths:
        try:
            os.statvfs(path)
        except OSError as err:
            yield Finding("staging", WARN, f"{path}: {err.strerror or err}", "fix staging.paths in --config.file")
        else:
            yield Finding("staging", OK, f"{path}")


def findings(args: argparse.Namespace) -> Iterator[Finding]:
    try:
        cfg = config.load(args.config_file)
    except config.ConfigError as err:
        yield Finding("config", FAIL, str(err), "fix the key named; the exporter will not start with it")
        return
    yield Finding("config", OK, str(args.config_file) if args.config_file else "none (defaults)")
    try:
        web = webconfig.load(args.web_config)
        yield Finding("web config", OK, f"{args.web_config}: TLS {'on' if web.ssl_context else 'off'}, "
                      f"{len(web.users)} users" if args.web_config else "none (plain HTTP, no auth)")
    except config.ConfigError as err:
        yield Finding("web config", FAIL, str(err), "fix it; the exporter will not start with it")
    if args.nvml_simulate:
        from gpunode_exporter import nvmlsim

        try:
            nvmlsim.install(nvmlsim.load(args.nvml_simulate))
        except config.ConfigError as err:
            yield Finding("nvml", FAIL, str(err), "fix the scenario file")
            return
        yield Finding("nvml", WARN, f"SIMULATED from {args.nvml_simulate}", "drop --nvml.simulate on a real node")
    ctx = collectors.context(args, cfg)
    enabled = set(collectors.enabled_collectors(args))
    checks: dict[str, Callable[[], Iterator[Finding]]] = {
        "gpu": lambda: _nvml(ctx),
        "xid": lambda: (*_kmsg(ctx, _nvml_works(ctx)), *_state(ctx)),
        "nfs": lambda: _nfs(ctx),
        "checkpoint": lambda: _checkpoint(ctx),
        "storage_network": lambda: _storage(ctx),
        "gpu_processes": lambda: _gpu_processes(ctx),
        "staging": lambda: _staging(ctx),
    }
    for collector, check in checks.items():
        if collector in enabled:
            try:
                yield from check()
            except Exception as err:  # a check must not end the others: say so and go on
                yield Finding(collector, FAIL, f"the check itself failed: {err!r}", "please report this")
        else:
            yield Finding(collector, OFF, "collector disabled")


def _nvml_works(ctx: Context) -> bool:
    import pynvml

    try:
        ctx.nvml.devices()
    except pynvml.NVMLError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    rows = list(findings(args))
    width = max(len(r.check) for r in rows)
    for row in rows:
        print(f"{row.check:<{width}}  {row.status:<4}  {row.seen}")
        if row.fix:
            print(f"{'':<{width}}        -> {row.fix}")
    failed = [r.check for r in rows if r.status == FAIL]
    print(f"\n{len(failed)} failed" + (f": {', '.join(dict.fromkeys(failed))}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0

