"""One NVML session for the exporter: init with retry, devices, and their static facts.

Static facts (UUID, name, serial, PCI bus id, maximum PCIe link) are read when a
device is first seen and kept until the device set changes; collectors fetch only
dynamic values per scrape, and may keep what they learn about a device on it (what
it never supports is not asked again). When the driver goes away under us
(unloaded, upgraded), the session is dropped and the next call starts a new one.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml
from pynvml import NVMLError

T = TypeVar("T")

# Errors after which this session is useless: start a new one on the next call.
_SESSION_GONE = frozenset({pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                           pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH})
_CODE_NAMES = {value: name.removeprefix("NVML_ERROR_") for name, value in vars(pynvml).items()
               if name.startswith("NVML_ERROR_") and isinstance(value, int)}


def error_name(err: NVMLError) -> str:
    """NOT_SUPPORTED, GPU_IS_LOST, ...: stable label values, unlike the messages."""
    return code_name(err.value)


def code_name(code: int) -> str:
    """The name of an nvmlReturn_t, as error_name() gives it (per-field returns carry only the code)."""
    return _CODE_NAMES.get(code, str(code))


class GPULostError(Exception):
    """The device answered NVML_ERROR_GPU_IS_LOST: fallen off the bus until the node reboots."""


@dataclass
class Device:
    index: int
    handle: Any | None = None  # None while NVML cannot give one (lost before we first saw it)
    uuid: str = ""
    name: str = ""
    serial: str = ""
    pci_bus_id: str = ""  # NVML's form, 00000000:18:00.0
    max_link_generation: int | None = None
    max_link_width: int | None = None
    minor: int | None = None  # N of /dev/nvidiaN (not always the index); None when NVML does not say
    complete: bool = False  # every static fact read (or known unsupported)
    lost: bool = False  # NVML said GPU_IS_LOST on the last call that reached this device
    # Functions read with sticky=True that answered NOT_SUPPORTED or that the driver lacks.
    unsupported: set[str] = field(default_factory=set)
    # What a collector learned about the device (e.g. its NVLink field plan), kept with it.
    learned: dict[str, Any] = field(default_factory=dict)


class Session:
    """Thread-safe; every public method may raise NVMLError when NVML itself is unusable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = False
        self.driver_version = ""
        self._devices: list[Device] = []
        # Failed per-device calls other than NOT_SUPPORTED and GPU_IS_LOST: (index, function, error).
        self.errors: Counter[tuple[int, str, str]] = Counter()

    def devices(self) -> list[Device]:
        """This scrape's device list; only new or incomplete devices cost more than one call."""
        with self._lock:
            if not self._started:
                pynvml.nvmlInit()
                self._started = True
                try:
                    self.driver_version = self.call(pynvml.nvmlSystemGetDriverVersion) or ""
                except NVMLError as err:
                    if err.value in _SESSION_GONE:
                        raise
                    self.driver_version = ""  # a label, not worth failing the scrape for
            count = self.call(pynvml.nvmlDeviceGetCount) or 0
            if count != len(self._devices):
                self._devices = [Device(i) for i in range(count)]
            for device in self._devices:
                if not device.complete:
                    self._read_static(device)
            return list(self._devices)

    def call(self, fn: Callable[..., T], *args: Any) -> T | None:
        """fn(*args); None when NOT_SUPPORTED. Drops the session when the driver went away."""
        try:
            return fn(*args)
        except NVMLError as err:
            if err.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GPULostError() from err
            if err.value in _SESSION_GONE:
                self._started = False
                self._devices = []
            raise

    def read(self, device: Device, fn: Callable[..., T], *args: Any, sticky: bool = False) -> T | None:
        """fn(device.handle, *args): None when unsupported, absent from the driver, or failed
        (failures counted in errors). sticky: a function that answered NOT_SUPPORTED or that the
        driver lacks is remembered on the device and not called again.

        Raises GPULostError (and marks the device lost), or NVMLError when the session is gone.
        """
        name = fn.__name__
        if sticky and name in device.unsupported:
            return None
        try:
            value = self.call(fn, device.handle, *args)
        except GPULostError:
            device.lost = True
            raise
        except NVMLError as err:
            if err.value in _SESSION_GONE:
                raise
            if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:  # an older driver: as NOT_SUPPORTED
                device.unsupported.add(name)
                return None
            self.errors[(device.index, name, error_name(err))] += 1
            return None
        device.lost = False
        if value is None and sticky:
            device.unsupported.add(name)
        return value

    def _read_static(self, device: Device) -> None:
        failures = self.errors.total()
        try:
            if device.handle is None:
                device.handle = self.read(device, _handle_by_index, device.index)
                if device.handle is None:
                    return
            device.uuid = self.read(device, pynvml.nvmlDeviceGetUUID) or ""
            device.name = self.read(device, pynvml.nvmlDeviceGetName) or ""
            device.serial = self.read(device, pynvml.nvmlDeviceGetSerial) or ""
            pci = self.read(device, pynvml.nvmlDeviceGetPciInfo)
            device.pci_bus_id = _text(pci.busId) if pci is not None else ""
            device.max_link_generation = self.read(device, pynvml.nvmlDeviceGetMaxPcieLinkGeneration)
            device.max_link_width = self.read(device, pynvml.nvmlDeviceGetMaxPcieLinkWidth)
            device.minor = self.read(device, pynvml.nvmlDeviceGetMinorNumber)
            device.complete = self.errors.total() == failures
        except GPULostError:
            pass  # facts are retried next scrape; the collector reports the GPU down

    def close(self) -> None:
        with self._lock:
            if self._started:
                self._started = False
                self._devices = []
                pynvml.nvmlShutdown()


def _handle_by_index(_handle: None, index: int) -> Any:
    """nvmlDeviceGetHandleByIndex shaped like the per-device calls, so read() can count its errors."""
    return pynvml.nvmlDeviceGetHandleByIndex(index)


_handle_by_index.__name__ = "nvmlDeviceGetHandleByIndex"  # the name errors are counted under


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# --- the NVLink fabric (nvmlDeviceGetGpuFabricInfoV, nvmlDeviceGetGpuFabricInfo) -----------------

FABRIC_STATES = frozenset({pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
                           pynvml.NVML_GPU_FABRIC_STATE_COMPLETED})
# healthMask fields (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_* / _WIDTH_*) whose value TRUE is bad.
_HEALTH_FLAGS = {
    "degraded_bandwidth": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
                           pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW),
    "route_recovery": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
                       pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_RECOVERY),
    "route_unhealthy": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
                        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY),
    "access_timeout_recovery": (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
                                pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ACCESS_TIMEOUT_RECOVERY),
}
_CONFIGURATION = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION,
                  pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION)
_CONFIGURATION_OK = frozenset({pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED,
                               pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE})
_FABRIC_V3, _FABRIC_V2 = pynvml.nvmlGpuFabricInfo_v3, pynvml.nvmlGpuFabricInfo_v2
_FABRIC_STRUCTS = {_FABRIC_V3: pynvml.c_nvmlGpuFabricInfo_v3_t, _FABRIC_V2: pynvml.c_nvmlGpuFabricInfo_v2_t}
_FABRIC_VERSION_KEY = "fabric_info_version"


@dataclass(frozen=True)
class FabricInfo:
    state: int  # NVML_GPU_FABRIC_STATE_*
    status: int  # nvmlReturn_t of the fabric probe
    health_mask: int | None  # None from the old call, which has no mask


def health_problems(mask: int) -> list[str]:
    """The fields of a healthMask that say the fabric is not healthy: degraded_bandwidth,
    route_recovery, route_unhealthy, access_timeout_recovery (each TRUE), incorrect_configuration
    (anything but NONE or NOT_SUPPORTED). Partition and fabric-manager-connection fields are facts
    about the partition, not faults of the GPU, and are not judged."""
    problems = [name for name, (shift, width) in _HEALTH_FLAGS.items()
                if (mask >> shift) & width == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE]
    shift, width = _CONFIGURATION
    if (mask >> shift) & width not in _CONFIGURATION_OK:
        problems.append("incorrect_configuration")
    return problems


def fabric_healthy(info: FabricInfo) -> bool:
    """Complete, probed without error, and no bad field in the health mask (where there is one).
    nvml.h: the status "must be checked only if Probe state returns complete", so a fabric not yet
    complete is not healthy."""
    if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != pynvml.NVML_SUCCESS:
        return False
    return info.health_mask is None or not health_problems(info.health_mask)


def _fabric_info_v(handle: Any, learned: dict[str, Any]) -> FabricInfo:
    """nvmlDeviceGetGpuFabricInfoV with the newest struct the driver takes (v3, then v2; the one
    that worked is kept in `learned`). A driver that takes neither answers as one without the call."""
    version = learned.get(_FABRIC_VERSION_KEY, _FABRIC_V3)
    while True:
        info = _FABRIC_STRUCTS[version]()
        try:
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except NVMLError as err:
            if err.value != pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                raise
            if version == _FABRIC_V2:
                raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) from err
            version = learned[_FABRIC_VERSION_KEY] = _FABRIC_V2
            continue
        return FabricInfo(info.state, info.status, info.healthMask)


_fabric_info_v.__name__ = "nvmlDeviceGetGpuFabricInfoV"


def _fabric_info(handle: Any) -> FabricInfo:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    return FabricInfo(info.state, info.status, None)


_fabric_info.__name__ = "nvmlDeviceGetGpuFabricInfo"


def read_fabric(session: Session, device: Device) -> FabricInfo | None:
    """The GPU's fabric: the V call, else (a driver without it) the old one. None when the GPU has
    no fabric (NOT_SUPPORTED, state NOT_SUPPORTED, neither call in the driver) or the read failed
    (counted in session.errors). Raises GPULostError as Session.read does."""
    info = session.read(device, _fabric_info_v, device.learned, sticky=True)
    if info is None and _fabric_info_v.__name__ in device.unsupported:
        info = session.read(device, _fabric_info, sticky=True)
    if info is None or info.state not in FABRIC_STATES:
        return None
    return info
