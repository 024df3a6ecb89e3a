"""NvmlBackend.topology against the stand-in `pynvml` (tests/gpu/test_nvml.py), given NVLinks, PCIe
ancestors and NUMA nodes: what a node publishes as `volcano.sh/gpu-topology` on real hardware."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml as real_nvml
import pytest

from deviceplugin.fit.topology import Topology
from deviceplugin.gpu.nvml import NvmlBackend
from deviceplugin.gpu.nvml_topology import bus_key
from tests.gpu.test_nvml import NOT_SUPPORTED, UNKNOWN, NVMLError, StandInGpu, StandInNvml, write_numa

ENABLED, DISABLED = real_nvml.NVML_FEATURE_ENABLED, real_nvml.NVML_FEATURE_DISABLED
TO_GPU, TO_SWITCH = real_nvml.NVML_NVLINK_DEVICE_TYPE_GPU, real_nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
INVALID_ARGUMENT = real_nvml.NVML_ERROR_INVALID_ARGUMENT
FUNCTION_NOT_FOUND = real_nvml.NVML_ERROR_FUNCTION_NOT_FOUND
LEVELS: dict[str, int] = {
    name: getattr(real_nvml, f"NVML_TOPOLOGY_{name}")
    for name in ("INTERNAL", "SINGLE", "MULTIPLE", "HOSTBRIDGE", "NODE", "SYSTEM")
}
SWITCH_BUS = "00000000:C5:00.0"  # an NVSwitch's PCI function


@dataclass
class NvLink:
    remote: str  # the far end's PCI bus id
    kind: int = TO_GPU
    state: int = ENABLED


@dataclass
class LinkedGpu(StandInGpu):
    nvlinks: list[NvLink] = field(default_factory=list)  # link index -> link; beyond: no such link
    numa_id: int = 0


class LinkedNvml(StandInNvml):
    """The stand-in with NVML's topology calls, answering from each GPU's links and a table of
    PCIe common-ancestor levels (SYSTEM for a pair not in it)."""

    NVML_ERROR_INVALID_ARGUMENT = INVALID_ARGUMENT
    NVML_ERROR_FUNCTION_NOT_FOUND = FUNCTION_NOT_FOUND
    NVML_FEATURE_ENABLED = ENABLED
    NVML_NVLINK_MAX_LINKS = real_nvml.NVML_NVLINK_MAX_LINKS
    NVML_NVLINK_DEVICE_TYPE_SWITCH = TO_SWITCH
    NVML_TOPOLOGY_INTERNAL = real_nvml.NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE = real_nvml.NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE = real_nvml.NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = real_nvml.NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE = real_nvml.NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM = real_nvml.NVML_TOPOLOGY_SYSTEM

    def __init__(self, gpus: list[LinkedGpu], levels: dict[tuple[int, int], str] | None = None) -> None:
        super().__init__(list(gpus))
        self.linked = gpus
        self.levels = levels or {}

    def nvmlDeviceGetTopologyCommonAncestor(self, first: LinkedGpu, second: LinkedGpu) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", first)
        low, high = sorted((self.linked.index(first), self.linked.index(second)))
        level: int = LEVELS[self.levels.get((low, high), "SYSTEM")]
        return level

    def _link(self, name: str, gpu: LinkedGpu, link: int) -> NvLink:
        self._enter(name, gpu)
        if link >= len(gpu.nvlinks):
            raise NVMLError(INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, gpu: LinkedGpu, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkState", gpu, link).state

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: LinkedGpu, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link("nvmlDeviceGetNvLinkRemotePciInfo", gpu, link).remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: LinkedGpu, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", gpu, link).kind

    def nvmlDeviceGetNumaNodeId(self, gpu: LinkedGpu) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", gpu)
        return gpu.numa_id


def bus(n: int) -> str:
    return f"00000000:{0x10 + n:02X}:00.0"


def gpus(count: int) -> list[LinkedGpu]:
    return [
        LinkedGpu(
            f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd", minor=n, bus_id=bus(n), numa_id=n * 2 // count
        )
        for n in range(count)
    ]


def bridge(first: LinkedGpu, second: LinkedGpu, lanes: int) -> None:
    first.nvlinks += [NvLink(second.bus_id) for _ in range(lanes)]  # type: ignore[arg-type]
    second.nvlinks += [NvLink(first.bus_id) for _ in range(lanes)]  # type: ignore[arg-type]


def read(nvml: LinkedNvml, tmp_path: Path, only: list[int] | None = None) -> Topology:
    backend = NvmlBackend(nvml, tmp_path)
    served = [gpu for gpu in backend.inventory().gpus if only is None or gpu.index in only]
    return backend.topology(served)


def pairs(topology: Topology) -> dict[tuple[int, int], str]:
    return {(a, b): str(topology.link(a, b)) for a, b in itertools.combinations(topology.gpus, 2)}


def test_nvswitch_links_reach_every_gpu_on_the_switches(tmp_path: Path) -> None:
    """A DGX A100: twelve links from each GPU to the NVSwitches, none GPU to GPU; every pair NV12."""
    node = gpus(4)
    for gpu in node:
        gpu.nvlinks = [NvLink(SWITCH_BUS, TO_SWITCH) for _ in range(12)]
    topology = read(LinkedNvml(node), tmp_path)
    assert set(pairs(topology).values()) == {"NV12"}
    assert topology.numa == (0, 0, 1, 1)


def test_bridged_pairs_count_their_links_and_the_rest_read_pcie(tmp_path: Path) -> None:
    node = gpus(4)
    bridge(node[0], node[1], 4)
    bridge(node[2], node[3], 4)
    node[0].nvlinks.append(NvLink(bus(1), state=DISABLED))  # a link that is down counts for nothing
    levels = {(0, 1): "SINGLE", (2, 3): "SINGLE", (0, 2): "NODE", (1, 3): "HOSTBRIDGE"}
    topology = read(LinkedNvml(node, levels), tmp_path)
    assert pairs(topology) == {
        (0, 1): "NV4",
        (2, 3): "NV4",
        (0, 2): "NODE",
        (1, 3): "PHB",
        (0, 3): "SYS",
        (1, 2): "SYS",
    }


@pytest.mark.parametrize(
    ("level", "kind"),
    [
        ("INTERNAL", "PIX"),
        ("SINGLE", "PIX"),
        ("MULTIPLE", "PXB"),
        ("HOSTBRIDGE", "PHB"),
        ("NODE", "NODE"),
        ("SYSTEM", "SYS"),
    ],
)
def test_common_ancestor_levels_read_as_nvidia_smi_classes(tmp_path: Path, level: str, kind: str) -> None:
    topology = read(LinkedNvml(gpus(2), {(0, 1): level}), tmp_path)
    assert str(topology.link(0, 1)) == kind


def test_a_driver_without_the_remote_type_still_counts_links_to_gpus(tmp_path: Path) -> None:
    node = gpus(2)
    node[0].nvlinks = [NvLink("0000:11:00.0"), NvLink("0000:11:00.0")]  # the legacy bus id form
    node[1].nvlinks = [NvLink(bus(0)), NvLink(bus(0))]
    for gpu in node:
        gpu.failures["nvmlDeviceGetNvLinkRemoteDeviceType"] = FUNCTION_NOT_FOUND
    assert str(read(LinkedNvml(node), tmp_path).link(0, 1)) == "NV2"


def test_an_excluded_gpu_is_left_out(tmp_path: Path) -> None:
    node = gpus(3)
    bridge(node[1], node[2], 2)
    topology = read(LinkedNvml(node), tmp_path, only=[1, 2])
    assert topology.gpus == (1, 2)
    assert pairs(topology) == {(1, 2): "NV2"}


def test_numa_falls_back_to_sysfs_then_unknown(tmp_path: Path) -> None:
    node = gpus(2)
    for gpu in node:
        gpu.failures["nvmlDeviceGetNumaNodeId"] = NOT_SUPPORTED
    write_numa(tmp_path, "0000:10:00.0", "1\n")  # GPU 0's PCI device; GPU 1's has none
    assert read(LinkedNvml(node), tmp_path).numa == (1, -1)


def test_failing_queries_degrade_the_pair_and_are_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pair of GPU 0 fails its PCIe query, GPU 1 cannot read its links: those pairs read SYS
    (the worst), the bridge still counts from GPU 2's side, and the daemon goes on."""
    node = gpus(4)
    bridge(node[1], node[2], 2)
    node[0].failures["nvmlDeviceGetTopologyCommonAncestor"] = UNKNOWN
    node[1].failures["nvmlDeviceGetNvLinkState"] = UNKNOWN
    node[3].failures["nvmlDeviceGetNumaNodeId"] = UNKNOWN
    levels = {(0, 1): "SINGLE", (0, 2): "SINGLE", (0, 3): "SINGLE", (2, 3): "MULTIPLE"}
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.nvml_topology"):
        topology = read(LinkedNvml(node, levels), tmp_path)
    assert pairs(topology) == {
        (0, 1): "SYS",
        (0, 2): "SYS",
        (0, 3): "SYS",
        (1, 2): "NV2",
        (1, 3): "SYS",
        (2, 3): "PXB",
    }
    assert topology.numa == (0, 0, 1, -1)
    logged = [(record.getMessage(), getattr(record, "call", None)) for record in caplog.records]
    assert len(logged) == 3, logged  # one per distinct failure, not one per pair or link


def test_a_gpu_without_a_handle_reads_worst(tmp_path: Path) -> None:
    node = gpus(2)
    node[1].failures["nvmlDeviceGetHandleByUUID"] = UNKNOWN
    bridge(node[0], node[1], 2)
    topology = read(LinkedNvml(node, {(0, 1): "SINGLE"}), tmp_path)
    assert str(topology.link(0, 1)) == "NV2"  # GPU 0 still sees its links to GPU 1
    assert topology.numa == (0, -1)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("00000000:3B:00.0", "00000000:3b:00.0"),
        ("0000:3b:00.0", "00000000:3b:00.0"),
        (b"00000000:3B:00.0\0", "00000000:3b:00.0"),
        ("odd", "odd"),
    ],
)
def test_bus_key(text: str | bytes, key: str) -> None:
    assert bus_key(text) == key
