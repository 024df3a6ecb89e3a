"""Fake GPUs' interconnect: the presets, topology files (every fault named with its file and field),
and the fake backend describing only the GPUs it is asked about."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from deviceplugin.fit.topology import Link, decode_topology
from deviceplugin.gpu.base import BackendError
from deviceplugin.gpu.fake import FakeBackend
from deviceplugin.gpu.topology import PRESETS, read_topology


def links(name: str) -> dict[tuple[int, int], str]:
    topology = read_topology(name).topology
    return {(a, b): str(topology.link(a, b)) for a, b in itertools.combinations(topology.gpus, 2)}


def test_dgx_a100_every_pair_is_twelve_nvlinks_through_the_switches() -> None:
    topology = read_topology("dgx-a100").topology
    assert topology.gpus == tuple(range(8))
    assert set(links("dgx-a100").values()) == {"NV12"}
    assert topology.numa == (0, 0, 0, 0, 1, 1, 1, 1)


def test_pcie_2socket_switch_pairs_socket_halves_and_cross_socket() -> None:
    pairs = links("pcie-2socket")
    assert [pairs[(0, 1)], pairs[(2, 3)], pairs[(4, 5)], pairs[(6, 7)]] == ["PIX"] * 4
    assert [pairs[(0, 2)], pairs[(1, 3)], pairs[(4, 7)]] == ["NODE"] * 3
    assert [pairs[(0, 4)], pairs[(3, 4)], pairs[(1, 7)]] == ["SYS"] * 3
    assert read_topology("pcie-2socket").topology.numa == (0, 0, 0, 0, 1, 1, 1, 1)


def test_nvlink_pairs_bridges_two_pairs_on_two_sockets() -> None:
    pairs = links("nvlink-pairs")
    assert pairs == {(0, 1): "NV4", (2, 3): "NV4", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS", (1, 3): "SYS"}
    assert read_topology("nvlink-pairs").topology.numa == (0, 0, 1, 1)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_survives_the_annotation(name: str) -> None:
    topology = read_topology(name).topology
    assert decode_topology(topology.encode()) == topology


def write(tmp_path: Path, document: object) -> str:
    path = tmp_path / "topology.json"
    text = document if isinstance(document, str) else json.dumps(document)
    path.write_bytes(text.encode(errors="surrogateescape"))
    return str(path)


def test_a_file_names_pairs_and_a_default(tmp_path: Path) -> None:
    path = write(tmp_path, {"numa": [0, 0, 1], "links": {"1-0": "NV2"}, "default": "PHB"})
    named = read_topology(path)
    assert named.source == path
    assert named.topology.link(0, 1) == Link("NV", 2)
    assert named.topology.link(0, 2) == named.topology.link(1, 2) == Link("PHB")
    assert named.topology.numa == (0, 0, 1)


def test_a_file_without_default_names_every_pair(tmp_path: Path) -> None:
    path = write(tmp_path, {"numa": [-1, -1], "links": {"0-1": "PIX"}})
    topology = read_topology(path).topology
    assert (str(topology.link(0, 1)), topology.numa) == ("PIX", (-1, -1))


@pytest.mark.parametrize(
    ("document", "fault"),
    [
        ("{not json", "invalid JSON"),
        ("\udcff", "invalid JSON"),  # not UTF-8 on disk
        ("[" * 100_000, "invalid JSON"),
        ([0, 1], "must hold a JSON object"),
        ({"numa": [0], "links": {}, "gpus": [0]}, "unknown key(s) gpus"),
        ({"links": {}}, "numa: must be a non-empty list"),
        ({"numa": [], "links": {}}, "numa: must be a non-empty list"),
        ({"numa": [0, "1"], "links": {}}, "numa[1]: '1' must be a NUMA node number"),
        ({"numa": [0, -2], "links": {}}, "numa[1]: -2 must be a NUMA node number, or -1"),
        ({"numa": [0, True], "links": {}}, "numa[1]: True must be a NUMA node number"),
        ({"numa": [0, 0]}, "links: must be an object of GPU pairs"),
        ({"numa": [0, 0], "links": ["0-1"]}, "links: must be an object of GPU pairs"),
        ({"numa": [0, 0], "links": {"0_1": "PIX"}}, "links['0_1']: a pair is two GPU indices"),
        ({"numa": [0, 0], "links": {"0--1": "PIX"}}, "links['0--1']: a pair is two GPU indices"),
        ({"numa": [0, 0], "links": {"1-1": "PIX"}}, "links['1-1']: a GPU has no link to itself"),
        ({"numa": [0, 0], "links": {"0-2": "PIX"}}, "links['0-2']: GPU 2 is not one of the 2 GPUs"),
        ({"numa": [0, 0], "links": {"0-1": "PIX", "1-0": "SYS"}}, "the pair 0-1 is given twice"),
        ({"numa": [0, 0], "links": {"0-1": "NVLINK"}}, "links['0-1']: link 'NVLINK' is none of NV1..NV18"),
        ({"numa": [0, 0], "links": {"0-1": "NV19"}}, "links['0-1']: link 'NV19' is none of"),
        ({"numa": [0, 0], "links": {"0-1": 4}}, "links['0-1']: 4 must be a link class"),
        ({"numa": [0, 0, 0], "links": {"0-1": "PIX"}}, "links: 2 pair(s) not given (0-2, 1-2)"),
        ({"numa": [0, 0, 0], "links": {}, "default": "FAST"}, "default: link 'FAST' is none of"),
    ],
)
def test_every_malformed_file_names_the_file_and_the_field(
    tmp_path: Path, document: object, fault: str
) -> None:
    path = write(tmp_path, document)
    with pytest.raises(ValueError) as caught:
        read_topology(path)
    assert str(caught.value).startswith(f"topology file {path}: ")
    assert fault in str(caught.value)


def test_neither_preset_nor_file_names_the_presets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'dgx-h100' is neither a preset \(dgx-a100, pcie-2socket"):
        read_topology("dgx-h100")


# --- the fake backend ---------------------------------------------------------------------------


def test_fake_gpus_without_topology_know_none() -> None:
    backend = FakeBackend.from_spec("2x1024")
    assert backend.topology(backend.inventory().gpus) is None


def test_fake_gpus_take_the_preset_and_describe_only_the_gpus_asked_about() -> None:
    backend = FakeBackend.from_spec("4x1024", topology=read_topology("nvlink-pairs"))
    gpus = backend.inventory().gpus
    whole = backend.topology(gpus)
    assert whole == read_topology("nvlink-pairs").topology
    served = backend.topology([gpus[1], gpus[2], gpus[3]])  # GPU 0 excluded
    assert served is not None
    assert served.gpus == (1, 2, 3) and served.numa == (0, 1, 1)
    assert (str(served.link(2, 3)), str(served.link(1, 2))) == ("NV4", "SYS")
    assert not served.describes(0)


def test_a_failed_gpu_still_counts_toward_the_topology(tmp_path: Path) -> None:
    """The spec lists four GPUs (one fails to enumerate): a 4-GPU preset fits, the served three get it."""
    entries = [{"uuid": f"GPU-{n}", "model": "A100", "memory_mib": 1024} for n in range(4)]
    entries[0]["fail"] = "Unknown Error"
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps(entries))
    backend = FakeBackend.from_spec(str(spec), topology=read_topology("nvlink-pairs"))
    served = backend.topology(backend.inventory().gpus)
    assert served is not None and served.gpus == (1, 2, 3)


def test_a_preset_for_another_gpu_count_is_refused() -> None:
    with pytest.raises(BackendError, match="--fake-gpu-topology dgx-a100: describes 8 GPUs, the node has 4"):
        FakeBackend.from_spec("4x1024", topology=read_topology("dgx-a100"))


def test_fake_gpus_sit_on_the_topologys_numa_nodes() -> None:
    """The NUMA node kubelet's topology hints get (GpuInfo.numa) is the one the annotation publishes."""
    backend = FakeBackend.from_spec("4x1024", topology=read_topology("nvlink-pairs"))
    assert [gpu.numa for gpu in backend.inventory().gpus] == [0, 0, 1, 1]


def test_a_topologys_unknown_numa_node_gives_no_hint(tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({"numa": [-1, 1], "default": "SYS", "links": {}}))
    backend = FakeBackend.from_spec("2x1024", topology=read_topology(str(path)))
    assert [gpu.numa for gpu in backend.inventory().gpus] == [None, 1]


def test_a_spec_numa_node_that_contradicts_the_topology_is_refused(tmp_path: Path) -> None:
    entries = [{"uuid": f"GPU-{n}", "model": "A100", "memory_mib": 1024, "numa": 0} for n in range(4)]
    entries[1]["numa"] = None  # not given: the topology's
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps(entries))
    with pytest.raises(
        BackendError, match="--fake-gpu-topology nvlink-pairs: GPU 2 is on NUMA node 1, the spec says 0"
    ):
        FakeBackend.from_spec(str(spec), topology=read_topology("nvlink-pairs"))
    entries[2]["numa"] = entries[3]["numa"] = 1
    spec.write_text(json.dumps(entries))
    backend = FakeBackend.from_spec(str(spec), topology=read_topology("nvlink-pairs"))
    assert [gpu.numa for gpu in backend.inventory().gpus] == [0, 0, 1, 1]
