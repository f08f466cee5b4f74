"""NVIDIA GPUs from sysfs: what counts as a GPU, and whether it still answers on the bus."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode_exporter.sysfs.pci import PCIGPU, BusScanner, canonical_bus_id, nvidia_gpus

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
DGX = FIXTURES / "dgx-h100"
EDGE = FIXTURES / "edge"

H100_SXM5 = 0x2330
REV_A1 = 0xA1
# A DGX H100's GPUs (lspci of a real one; NVIDIA's Fabric Manager guide shows the same).
DGX_GPUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]
NVSWITCHES = ["0000:07:00.0", "0000:08:00.0", "0000:09:00.0", "0000:0a:00.0"]
ASPEED_VGA = "0000:04:00.0"
CONNECTX7 = "0000:18:00.0"

# What edge/ changes (see tests/fixtures/sysfs/README.md).
FALLEN_OFF, SUSPENDED, UNREADABLE, VGA_CLASS, NO_REVISION = (
    "0000:52:00.0", "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")


def by_address(gpus: list[PCIGPU]) -> dict[str, PCIGPU]:
    return {gpu.address: gpu for gpu in gpus}


@pytest.fixture
def edge_copy(tmp_path: Path) -> Path:
    """A writable copy of edge/ (symlinks stay symlinks, and stay relative)."""
    root = tmp_path / "sys"
    shutil.copytree(EDGE, root, symlinks=True)
    return root


def device_dir(root: Path, address: str) -> Path:
    return root / "bus" / "pci" / "devices" / address


@pytest.fixture
def opened_configs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Addresses whose config file the code under test opens."""
    opened: list[str] = []
    real_open = os.open

    def spy(path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if os.path.basename(path) == "config":
            opened.append(os.path.basename(os.path.dirname(path)))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    yield opened


# --- dgx-h100/: a healthy node ----------------------------------------------------------------


def test_dgx_h100_finds_the_eight_gpus_in_address_order() -> None:
    gpus = nvidia_gpus(DGX)
    assert [gpu.address for gpu in gpus] == DGX_GPUS
    assert all(gpu == PCIGPU(gpu.address, H100_SXM5, REV_A1, True) for gpu in gpus)


def test_nvswitches_aspeed_and_nics_are_not_gpus() -> None:
    # Each is in the tree, so leaving it out is the filter's doing, not the fixture's.
    for address in [*NVSWITCHES, ASPEED_VGA, CONNECTX7]:
        assert (device_dir(DGX, address) / "vendor").is_file()
    found = {gpu.address for gpu in nvidia_gpus(DGX)}
    assert found.isdisjoint([*NVSWITCHES, ASPEED_VGA, CONNECTX7])
    assert (device_dir(DGX, NVSWITCHES[0]) / "vendor").read_text() == "0x10de\n"  # NVIDIA, class 0x068000
    assert (device_dir(DGX, ASPEED_VGA) / "class").read_text() == "0x030000\n"  # VGA, vendor 0x1a03


def test_fixture_symlinks_are_relative_and_resolve() -> None:
    for tree in (DGX, EDGE):
        links = list((tree / "bus" / "pci" / "devices").iterdir())
        assert len(links) == 77
        for link in links:
            target = os.readlink(link)
            assert target.startswith("../../../devices/pci0000:"), target
            assert link.resolve().name == link.name
            assert link.resolve().is_relative_to(tree.resolve() / "devices")


# --- edge/: one GPU per failure ---------------------------------------------------------------


def test_edge_tree() -> None:
    gpus = by_address(nvidia_gpus(EDGE))
    assert sorted(gpus) == [a for a in DGX_GPUS if a != NO_REVISION]
    assert gpus[FALLEN_OFF] == PCIGPU(FALLEN_OFF, H100_SXM5, REV_A1, responding=False)
    assert gpus[SUSPENDED] == PCIGPU(SUSPENDED, H100_SXM5, REV_A1, responding=None)
    assert gpus[VGA_CLASS] == PCIGPU(VGA_CLASS, H100_SXM5, REV_A1, responding=True)
    for address in ("0000:1b:00.0", "0000:43:00.0", "0000:61:00.0", UNREADABLE):
        assert gpus[address].responding is True


def test_fallen_off_gpu_keeps_its_cached_identity() -> None:
    # What the kernel cached at enumeration still says H100 rev a1; only config says rev ff.
    directory = device_dir(EDGE, FALLEN_OFF)
    assert (directory / "revision").read_text() == "0xa1\n"
    config = (directory / "config").read_bytes()
    assert config[8] == 0xFF and set(config) == {0xFF}
    gpu = by_address(nvidia_gpus(EDGE))[FALLEN_OFF]
    assert (gpu.device_id, gpu.revision, gpu.responding) == (H100_SXM5, REV_A1, False)


def test_suspended_gpu_config_is_not_opened(opened_configs: list[str]) -> None:
    # Its config is all-ones in the fixture: had it been read, responding would be False.
    assert set((device_dir(EDGE, SUSPENDED) / "config").read_bytes()) == {0xFF}
    opened_configs.clear()  # that read was ours
    assert by_address(nvidia_gpus(EDGE))[SUSPENDED].responding is None
    assert SUSPENDED not in opened_configs
    assert FALLEN_OFF in opened_configs  # the spy does see config reads


@pytest.mark.parametrize("status", ["suspended", "suspending", "resuming", "error"])
def test_config_not_read_unless_awake(edge_copy: Path, status: str, opened_configs: list[str]) -> None:
    (device_dir(edge_copy, FALLEN_OFF) / "power" / "runtime_status").write_text(status + "\n")
    assert by_address(nvidia_gpus(edge_copy))[FALLEN_OFF].responding is None
    assert FALLEN_OFF not in opened_configs


def test_config_read_when_runtime_pm_is_off_or_absent(edge_copy: Path) -> None:
    # "unsupported": runtime PM disabled for the device, it is never suspended.
    (device_dir(edge_copy, FALLEN_OFF) / "power" / "runtime_status").write_text("unsupported\n")
    # No power/ at all: a kernel without CONFIG_PM.
    shutil.rmtree(device_dir(edge_copy, "0000:1b:00.0") / "power")
    gpus = by_address(nvidia_gpus(edge_copy))
    assert gpus[FALLEN_OFF].responding is False
    assert gpus["0000:1b:00.0"].responding is True


def test_unreadable_config_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def deny(path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if str(path).endswith(f"/{UNREADABLE}/config"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    gpus = by_address(nvidia_gpus(EDGE))
    assert gpus[UNREADABLE] == PCIGPU(UNREADABLE, H100_SXM5, REV_A1, responding=None)
    assert gpus["0000:1b:00.0"].responding is True
    assert gpus[FALLEN_OFF].responding is False


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode 000 file anyway")
def test_unreadable_config_by_mode(edge_copy: Path) -> None:
    (device_dir(edge_copy, UNREADABLE) / "config").chmod(0)
    assert by_address(nvidia_gpus(edge_copy))[UNREADABLE].responding is None


def test_missing_revision_skips_only_that_device() -> None:
    assert not (device_dir(EDGE, NO_REVISION) / "revision").exists()
    assert (device_dir(EDGE, NO_REVISION) / "vendor").read_text() == "0x10de\n"
    assert NO_REVISION not in by_address(nvidia_gpus(EDGE))


def test_malformed_or_missing_attributes_skip_the_device(edge_copy: Path) -> None:
    (device_dir(edge_copy, "0000:1b:00.0") / "vendor").write_text("garbage\n")
    (device_dir(edge_copy, "0000:43:00.0") / "class").unlink()
    (device_dir(edge_copy, "0000:61:00.0") / "device").write_bytes(b"\xff\xfe\n")
    found = by_address(nvidia_gpus(edge_copy))
    assert sorted(found) == [FALLEN_OFF, SUSPENDED, UNREADABLE, VGA_CLASS]


def test_short_config_is_unknown(edge_copy: Path) -> None:
    (device_dir(edge_copy, "0000:1b:00.0") / "config").write_bytes(b"\xde")
    assert by_address(nvidia_gpus(edge_copy))["0000:1b:00.0"].responding is None


# --- the sysfs root ----------------------------------------------------------------------------


def test_no_sysfs_or_no_pci_bus(tmp_path: Path) -> None:
    assert nvidia_gpus(tmp_path / "absent") == []
    assert nvidia_gpus(tmp_path) == []  # exists, but has no bus/pci/devices
    (tmp_path / "bus" / "pci").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").write_text("")  # not a directory
    assert nvidia_gpus(tmp_path) == []


def write_gpu(root: Path, address: str) -> None:
    directory = root / "bus" / "pci" / "devices" / address
    (directory / "power").mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200"), ("revision", "0xa1")):
        (directory / name).write_text(value + "\n")
    (directory / "power" / "runtime_status").write_text("active\n")
    (directory / "config").write_bytes(bytes.fromhex("de103023") + bytes(60))


def test_sorted_numerically_across_domains_and_odd_names_ignored(tmp_path: Path) -> None:
    # VMD puts NVMe/GPUs in domains above ffff; lexical order would put 10000 before ffff.
    for address in ("10000:01:00.0", "ffff:02:00.0", "0000:3b:00.0", "0000:3b:00.1"):
        write_gpu(tmp_path, address)
    write_gpu(tmp_path, "not-a-bus-id")
    assert [gpu.address for gpu in nvidia_gpus(tmp_path)] == [
        "0000:3b:00.0", "0000:3b:00.1", "ffff:02:00.0", "10000:01:00.0"]


# --- canonical_bus_id --------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "canonical"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML
    ("0000:3b:00.0", "0000:3b:00.0"),  # sysfs
    ("0000:3b:00", "0000:3b:00.0"),  # kernel log (NVRM: GPU at PCI:0000:3b:00)
    ("0000:3B:00.3", "0000:3b:00.3"),
    ("0000:3b:1f.7", "0000:3b:1f.7"),
    ("00010000:E1:00.0", "10000:e1:00.0"),  # VMD domain, NVML width
    ("10000:e1:00.0", "10000:e1:00.0"),  # VMD domain, sysfs
])
def test_canonical_bus_id(given: str, canonical: str) -> None:
    assert canonical_bus_id(given) == canonical


@pytest.mark.parametrize("given", [
    "",
    "3b:00.0",  # lspci without -D: no domain
    "000:3b:00.0",  # domain shorter than the kernel ever prints
    "000000000:3b:00.0",  # longer than NVML's 8
    "0000:3b:00.8",  # function is 3 bits
    "0000:3b:20.0",  # device is 5 bits
    "0000:3b:0.0",
    "0000:3g:00.0",
    "0000:3b:00.0 ",
    "0000:3b:00.",
    "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b",
])
def test_canonical_bus_id_rejects(given: str) -> None:
    with pytest.raises(ValueError):
        canonical_bus_id(given)


def test_scanner_reads_identity_once_and_follows_the_listing(edge_copy: Path) -> None:
    root = edge_copy
    scanner = BusScanner(root)
    assert "0000:1b:00.0" in by_address(scanner.scan())
    # Cached attributes are not read again: a changed `vendor` file goes unnoticed...
    (device_dir(root, "0000:1b:00.0") / "vendor").write_text("0x8086\n")
    assert "0000:1b:00.0" in by_address(scanner.scan())
    # ...while the live state is: config now reads all-ones.
    (device_dir(root, "0000:1b:00.0") / "config").write_bytes(b"\xff" * 256)
    assert by_address(scanner.scan())["0000:1b:00.0"].responding is False
    # A device that leaves the listing is forgotten; when it comes back it is identified anew.
    link = root / "bus" / "pci" / "devices" / "0000:1b:00.0"
    target = os.readlink(link)
    link.unlink()
    assert "0000:1b:00.0" not in by_address(scanner.scan())
    link.symlink_to(target)
    assert "0000:1b:00.0" not in by_address(scanner.scan())  # its vendor file now says Intel
    # A device whose identity could not be read is retried on the next scan.
    (device_dir(root, "0000:df:00.0") / "revision").write_text("0xa1\n")
    assert "0000:df:00.0" in by_address(scanner.scan())
