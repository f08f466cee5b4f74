"""GPU health: row remapping, presence (NVML and the PCI bus), PCIe link, the NVLink fabric (NVML's fabric
state, NVSwitches on the bus); what slows a GPU down (clocks event reasons and violation time, NVLink, PCIe
replays: gpu_straggler.py). From NVML and sysfs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pynvml

from gpunode_exporter.collector import gpu_straggler
from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.nvml import Device, GPULostError, fabric_healthy, read_fabric
from gpunode_exporter.sysfs import pci

log = logging.getLogger(__name__)

_GPU = ("gpu", "uuid")

INFO = MetricSpec("gpunode_gpu_info", "gauge", "A GPU as NVML names it; always 1.",
                  (*_GPU, "pci_bus_id", "name", "serial", "driver_version"))
UP = MetricSpec("gpunode_gpu_up", "gauge",
                "0 when NVML reports the GPU lost or its PCI config space reads all-ones (rev ff), else 1.",
                _GPU)
VISIBLE = MetricSpec("gpunode_gpus_visible", "gauge",
                     "GPUs the NVIDIA driver enumerates (nvml) and NVIDIA display/3D controllers on the "
                     "PCI bus (pci).", ("source",))
EXPECTED = MetricSpec("gpunode_gpus_expected", "gauge",
                      "GPUs this node should have (gpu.expected_count in --config.file).")
REMAPPED_ROWS = MetricSpec("gpunode_gpu_remapped_rows_total", "counter",
                           "Memory rows remapped to spare rows over the GPU's life, by the error that "
                           "caused it.", (*_GPU, "cause"))
REMAP_PENDING = MetricSpec("gpunode_gpu_row_remap_pending", "gauge",
                           "1 when a row remap waits for a GPU reset to take effect.", _GPU)
REMAP_FAILURE = MetricSpec("gpunode_gpu_row_remap_failure", "gauge",
                           "1 when a row remap has ever failed: NVIDIA's criterion to replace the GPU.",
                           _GPU)
REMAP_BANKS = MetricSpec("gpunode_gpu_remap_banks", "gauge",
                         "Memory banks by how many of their spare rows remain (max = all, none = no "
                         "spare left).", (*_GPU, "availability"))
LINK_GENERATION = MetricSpec("gpunode_gpu_pcie_link_generation", "gauge",
                             "PCIe link generation, current and the most the GPU and slot allow. An idle "
                             "GPU may train its link down to save power.", (*_GPU, "kind"))
LINK_WIDTH = MetricSpec("gpunode_gpu_pcie_link_width", "gauge",
                        "PCIe link width in lanes, current and the most the GPU and slot allow.",
                        (*_GPU, "kind"))
FABRIC_STATE = MetricSpec("gpunode_gpu_fabric_state", "gauge",
                          "The GPU's NVLink fabric as NVML reports it: 1 not started, 2 in progress, 3 completed "
                          "(the fabric manager has set up its routes). Absent where the GPU has no NVSwitch fabric.",
                          _GPU)
FABRIC_HEALTHY = MetricSpec("gpunode_gpu_fabric_healthy", "gauge",
                            "1 when the GPU's NVLink fabric is completed, its probe succeeded and the driver's "
                            "health mask (where it has one) shows no degraded bandwidth, route recovery, unhealthy "
                            "route, access timeout recovery or incorrect configuration; else 0.", _GPU)
NVSWITCHES_VISIBLE = MetricSpec("gpunode_nvswitches_visible", "gauge",
                                "NVSwitches on the PCI bus (pci: NVIDIA functions of class 0x0680).", ("source",))
NVSWITCHES_EXPECTED = MetricSpec("gpunode_nvswitches_expected", "gauge",
                                 "NVSwitches this node should have (gpu.nvswitches_expected in --config.file).")
NVML_ERRORS = MetricSpec("gpunode_nvml_errors_total", "counter",
                         "Per-GPU NVML calls that failed with an error other than NOT_SUPPORTED or "
                         "GPU_IS_LOST (for nvmlDeviceGetFieldValues: each field that failed).",
                         (*_GPU, "function", "error"))

_AVAILABILITY = ("max", "high", "partial", "low", "none")


@register
class GPUCollector(Collector):
    name = "gpu"
    description = ("GPU health from NVML and sysfs: row remapping, GPUs present, PCIe link, clocks event reasons, "
                   "NVLink, the NVLink fabric and its NVSwitches.")
    metrics = (INFO, UP, VISIBLE, EXPECTED, NVSWITCHES_VISIBLE, NVSWITCHES_EXPECTED, REMAPPED_ROWS, REMAP_PENDING,
               REMAP_FAILURE, REMAP_BANKS, LINK_GENERATION, LINK_WIDTH, FABRIC_STATE, FABRIC_HEALTHY,
               *gpu_straggler.SPECS, NVML_ERRORS)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._bus = pci.BusScanner(ctx.sysfs)
        self._logged: set[tuple[int, str, str]] = set()
        self._straggler = gpu_straggler.StragglerReads(ctx.nvml, ctx.config.gpu.nvlink_per_link)

    def collect(self) -> Iterator[Family]:
        cfg = self.ctx.config.gpu
        visible, expected = VISIBLE.family(), EXPECTED.family()
        switches, switches_expected = NVSWITCHES_VISIBLE.family(), NVSWITCHES_EXPECTED.family()
        if cfg.expected_count is not None:
            expected.add((), cfg.expected_count)
        if cfg.nvswitches_expected is not None:
            switches_expected.add((), cfg.nvswitches_expected)
        on_bus: dict[str, pci.PCIGPU] = {}
        if self._bus.devices.is_dir():  # absent in some containers
            on_bus = {g.address: g for g in self._bus.scan()}
            visible.add(("pci",), len(on_bus))
            switches.add(("pci",), self._bus.nvswitches)
        try:
            devices = self.ctx.nvml.devices()
        except pynvml.NVMLError:
            yield from (visible, expected, switches, switches_expected)  # presence on the bus matters most then
            raise
        visible.add(("nvml",), len(devices))
        yield from (visible, expected, switches, switches_expected)
        yield from self._per_gpu(devices, on_bus)

    def _per_gpu(self, devices: list[Device], on_bus: dict[str, pci.PCIGPU]) -> Iterator[Family]:
        session = self.ctx.nvml
        fams = {spec: spec.family() for spec in (INFO, UP, REMAPPED_ROWS, REMAP_PENDING, REMAP_FAILURE,
                                                  REMAP_BANKS, LINK_GENERATION, LINK_WIDTH, FABRIC_STATE,
                                                  FABRIC_HEALTHY, *gpu_straggler.SPECS)}
        for d in devices:
            ids = (str(d.index), d.uuid)
            if d.handle is None:
                if d.lost:
                    fams[UP].add(ids, 0)
                continue  # no handle for another reason: counted in gpunode_nvml_errors_total
            try:
                rows = session.read(d, pynvml.nvmlDeviceGetRemappedRows)
                banks = session.read(d, pynvml.nvmlDeviceGetRowRemapperHistogram)
                generation = session.read(d, pynvml.nvmlDeviceGetCurrPcieLinkGeneration)
                width = session.read(d, pynvml.nvmlDeviceGetCurrPcieLinkWidth)
                fabric = read_fabric(session, d)
                straggler = self._straggler.read(d, ids)
            except GPULostError:
                fams[UP].add(ids, 0)
                continue
            bus = on_bus.get(_canonical(d.pci_bus_id))
            fams[UP].add(ids, 0 if bus is not None and bus.responding is False else 1)
            fams[INFO].add((*ids, d.pci_bus_id, d.name, d.serial, session.driver_version), 1)
            if rows is not None:
                correctable, uncorrectable, pending, failure = rows
                fams[REMAPPED_ROWS].add((*ids, "correctable"), correctable)
                fams[REMAPPED_ROWS].add((*ids, "uncorrectable"), uncorrectable)
                fams[REMAP_PENDING].add(ids, pending)
                fams[REMAP_FAILURE].add(ids, failure)
            if banks is not None:
                for availability in _AVAILABILITY:
                    fams[REMAP_BANKS].add((*ids, availability), getattr(banks, availability))
            for spec, current, maximum in ((LINK_GENERATION, generation, d.max_link_generation),
                                           (LINK_WIDTH, width, d.max_link_width)):
                if current is not None:
                    fams[spec].add((*ids, "current"), current)
                if maximum is not None:
                    fams[spec].add((*ids, "max"), maximum)
            if fabric is not None:
                fams[FABRIC_STATE].add(ids, fabric.state)
                fams[FABRIC_HEALTHY].add(ids, int(fabric_healthy(fabric)))
            self._straggler.add(straggler, fams)
        yield from fams.values()
        yield self._errors(devices)

    def _errors(self, devices: list[Device]) -> Family:
        errors = NVML_ERRORS.family()
        uuids = {d.index: d.uuid for d in devices}
        for key, count in sorted(self.ctx.nvml.errors.items()):
            index, function, error = key
            if key not in self._logged:
                self._logged.add(key)
                log.warning("GPU %d: %s failed: %s (logged once, counted in %s)",
                            index, function, error, NVML_ERRORS.name)
            errors.add((str(index), uuids.get(index, ""), function, error), count)
        return errors


def _canonical(nvml_bus_id: str) -> str:
    try:
        return pci.canonical_bus_id(nvml_bus_id)
    except ValueError:
        return ""  # unknown or odd id: judge the GPU by NVML alone
