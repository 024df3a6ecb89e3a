"""How a node's GPUs connect, read from NVML (docs/topology.md, "Publication").

Per pair: the NVLinks between the two, else the closest common PCIe ancestor
(`nvmlDeviceGetTopologyCommonAncestor`) in `nvidia-smi topo -m`'s classes. NVLinks are counted
link by link: an active link (`nvmlDeviceGetNvLinkState`) whose far end
(`nvmlDeviceGetNvLinkRemotePciInfo`) is another GPU counts for that pair; one whose far end is an
NVSwitch (`nvmlDeviceGetNvLinkRemoteDeviceType`) reaches every GPU on the switches, so two GPUs
with switch links have as many NVLinks between them as the one with fewer switch links (a DGX
A100's GPUs: twelve each, every pair NV12, as `nvidia-smi topo -m` shows). NVIDIA's
go-gpuallocator counts only GPU-to-GPU links and leaves NVSwitch systems unhandled.

NUMA node: `nvmlDeviceGetNumaNodeId` (drivers from R535), else the PCI device's sysfs `numa_node`
as enumerated, else -1. A failing query never stops the daemon: the pair reads SYS, the NUMA node
-1, and each distinct failure is logged once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from deviceplugin.fit.topology import MAX_NVLINKS, NVLINK, UNKNOWN_NUMA, Link, Topology
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.logs import get_log

log = get_log(__name__)

# NVML's common-ancestor levels, by constant name, to nvidia-smi's classes. INTERNAL (two GPUs on
# one board, like a K80) sit behind the board's own PCIe switch.
_ANCESTORS = {
    "NVML_TOPOLOGY_INTERNAL": "PIX",
    "NVML_TOPOLOGY_SINGLE": "PIX",
    "NVML_TOPOLOGY_MULTIPLE": "PXB",
    "NVML_TOPOLOGY_HOSTBRIDGE": "PHB",
    "NVML_TOPOLOGY_NODE": "NODE",
    "NVML_TOPOLOGY_SYSTEM": "SYS",
}
_WORST = Link("SYS")
# Link indices that a GPU does not have answer these: not failures.
_NO_SUCH_LINK = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT")


def bus_key(bus_id: str | bytes) -> str:
    """A PCI bus id in one spelling, whatever the domain's width (`00000000:3B:00.0`, `0000:3b:00.0`)."""
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    domain, _, rest = text.rstrip("\0").partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest.lower()}"
    except ValueError:
        return text.lower()


class NvmlTopology:
    """Reads one topology through `nvml` (pynvml, or a stand-in with its names)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._error: type[Exception] = nvml.NVMLError
        self._logged: set[tuple[str, str]] = set()
        self._ancestors = {
            getattr(nvml, name): kind for name, kind in _ANCESTORS.items() if hasattr(nvml, name)
        }

    def read(self, gpus: Sequence[GpuInfo]) -> Topology:
        handles = {
            gpu.index: self._call(gpu.index, self._nvml.nvmlDeviceGetHandleByUUID, gpu.uuid) for gpu in gpus
        }
        by_bus = {bus_key(gpu.pci_bus_id): gpu.index for gpu in gpus if gpu.pci_bus_id}
        direct: dict[int, Counter[int]] = {}
        switch: dict[int, int] = {}
        for gpu in gpus:
            handle = handles[gpu.index]
            direct[gpu.index], switch[gpu.index] = (
                self._nvlinks(gpu.index, handle, by_bus) if handle is not None else (Counter(), 0)
            )

        def link(a: int, b: int) -> Link:
            lanes = max(direct[a][b], direct[b][a]) + min(switch[a], switch[b])
            if lanes:
                return Link(NVLINK, min(lanes, MAX_NVLINKS))
            if handles[a] is None or handles[b] is None:
                return _WORST
            return self._pcie(a, handles[a], handles[b])

        numa = [self._numa(gpu, handles[gpu.index]) for gpu in gpus]
        return Topology.build([gpu.index for gpu in gpus], numa, link)

    def _nvlinks(self, index: int, handle: Any, by_bus: dict[str, int]) -> tuple[Counter[int], int]:
        """Active NVLinks of one GPU: per peer GPU index, and to NVSwitches."""
        nvml = self._nvml
        peers: Counter[int] = Counter()
        switched = 0
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_NVLINKS)):
            state = self._link_query(index, nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state != nvml.NVML_FEATURE_ENABLED:
                continue  # inactive, absent, or unknown: not counted
            kind = self._link_query(index, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switched += 1
                continue
            # A driver that cannot tell the far end's type still names a GPU by its bus id.
            remote = self._link_query(index, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is not None and bus_key(remote.busId) in by_bus:
                peers[by_bus[bus_key(remote.busId)]] += 1
        return peers, switched

    def _link_query(self, index: int, call: Callable[..., Any], handle: Any, link: int) -> Any:
        """One NVLink query; None when the link does not exist or the query failed (logged once)."""
        try:
            return call(handle, link)
        except self._error as err:
            if not self._absent(err):
                self._failed(index, call.__name__, err)
            return None

    def _pcie(self, index: int, first: Any, second: Any) -> Link:
        try:
            level = self._nvml.nvmlDeviceGetTopologyCommonAncestor(first, second)
        except self._error as err:
            self._failed(index, "nvmlDeviceGetTopologyCommonAncestor", err)
            return _WORST
        kind = self._ancestors.get(level)
        if kind is None:
            self._note(index, "nvmlDeviceGetTopologyCommonAncestor", f"unknown level {level!r}")
            return _WORST
        return Link(kind)

    def _numa(self, gpu: GpuInfo, handle: Any) -> int:
        if handle is not None:
            try:
                node = self._nvml.nvmlDeviceGetNumaNodeId(handle)
            except self._error as err:
                if not self._absent(err):
                    self._failed(gpu.index, "nvmlDeviceGetNumaNodeId", err)
            else:
                if isinstance(node, int) and node >= 0:
                    return node
        return UNKNOWN_NUMA if gpu.numa is None else gpu.numa

    def _call(self, index: int, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._error as err:
            self._failed(index, call.__name__, err)
            return None

    def _absent(self, err: Exception) -> bool:
        """The driver or GPU does not have this (not a failure)."""
        code = getattr(err, "value", None)
        return any(
            code == getattr(self._nvml, name, object())
            for name in (*_NO_SUCH_LINK, "NVML_ERROR_FUNCTION_NOT_FOUND")
        )

    def _failed(self, index: int, call: str, err: Exception) -> None:
        self._note(index, call, str(err))

    def _note(self, index: int, call: str, problem: str) -> None:
        if (call, problem) in self._logged:
            return
        self._logged.add((call, problem))
        log.warning(
            "GPU topology query failed; the link or NUMA node is left at its worst",
            gpu=index,
            call=call,
            error=problem,
        )
