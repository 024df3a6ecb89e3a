"""The `volcano.sh/gpu-topology` annotation's codec (deviceplugin.fit.topology): what a node
publishes is read back as published, and every malformed value is an AnnotationError naming the
annotation and the fault, never another exception (a scheduler or `inspect` reading a broken node
goes on with the rest of the cluster)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.fit.errors import AnnotationError, FitInputError
from deviceplugin.fit.topology import (
    EXHAUSTIVE_LIMIT,
    MAX_NVLINKS,
    TOPOLOGY_KEY,
    Link,
    Topology,
    best_set,
    decode_topology,
    node_topology,
    parse_link,
)

FOUR = '{"gpus":[0,1,2,3],"numa":[0,0,1,-1],"links":["NV4","PIX","SYS","PXB","PHB","NODE"]}'


def test_the_documented_value_reads_back() -> None:
    topology = decode_topology(FOUR)
    assert topology.gpus == (0, 1, 2, 3)
    assert topology.numa == (0, 0, 1, -1)
    # the upper triangle row by row: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    assert [str(topology.link(a, b)) for a, b in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]] == [
        "NV4",
        "PIX",
        "SYS",
        "PXB",
        "PHB",
        "NODE",
    ]
    assert topology.link(3, 0) == topology.link(0, 3)
    assert topology.encode() == FOUR


def test_gpu_indices_need_not_be_contiguous() -> None:
    """A node with GPU 0 excluded publishes GPUs 1..3 by their own indices."""
    topology = decode_topology('{"gpus":[3,1,2],"numa":[1,0,0],"links":["SYS","SYS","NV2"]}')
    assert (str(topology.link(1, 2)), topology.numa_of(3), topology.describes(0)) == ("NV2", 1, False)


def test_link_ranks_order_nvidia_smi_classes() -> None:
    ranks = [parse_link(text).rank for text in ("SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV18")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def test_a_node_without_the_annotation_has_no_topology() -> None:
    assert node_topology({"metadata": {"name": "n"}}) is None
    assert node_topology({"metadata": {"annotations": {TOPOLOGY_KEY: FOUR}}}) == decode_topology(FOUR)


def document(**fields: object) -> str:
    base: dict[str, object] = {"gpus": [0, 1], "numa": [0, 0], "links": ["NV2"]}
    return json.dumps({**base, **fields})


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        pytest.param("", "Expecting value", id="empty"),
        pytest.param("{gpus: [0]}", "Expecting property name", id="bad-json"),
        pytest.param('{"gpus":[0,1]', "Expecting", id="truncated"),
        pytest.param("[0, 1]", "the value must be a JSON object", id="list"),
        pytest.param("null", "the value must be a JSON object", id="null"),
        pytest.param('"NV4"', "the value must be a JSON object", id="string"),
        pytest.param("[" * 100_000, "nested too deeply", id="deeply-nested"),
        pytest.param('{"numa":[0],"links":[]}', "'gpus' must be a list of integers", id="gpus-missing"),
        pytest.param(document(gpus="0,1"), "'gpus' must be a list of integers", id="gpus-text"),
        pytest.param(document(gpus=[0, "1"]), "'gpus' must be a list of integers", id="gpus-item-text"),
        pytest.param(document(gpus=[0, 1.0]), "'gpus' must be a list of integers", id="gpus-item-float"),
        pytest.param(document(gpus=[0, True]), "'gpus' must be a list of integers", id="gpus-item-bool"),
        pytest.param(document(gpus=[0, None]), "'gpus' must be a list of integers", id="gpus-item-null"),
        pytest.param(document(numa=None), "'numa' must be a list of integers", id="numa-null"),
        pytest.param(document(numa=[0, "0"]), "'numa' must be a list of integers", id="numa-item-text"),
        pytest.param(document(links="NV2"), "'links' must be a list of strings", id="links-text"),
        pytest.param(document(links=[2]), "'links' must be a list of strings", id="links-item-number"),
        pytest.param(document(links=None), "'links' must be a list of strings", id="links-null"),
        pytest.param(document(gpus=[-1, 0]), "GPU indices must not be negative", id="negative-gpu"),
        pytest.param(document(numa=[0, -2]), "NUMA nodes must be >= 0, or -1 when unknown", id="numa-below"),
        pytest.param(document(gpus=[1, 1]), "GPU indices repeat: [1, 1]", id="repeated-gpu"),
        pytest.param(document(numa=[0]), "1 NUMA nodes for 2 GPUs", id="numa-short"),
        pytest.param(document(numa=[0, 0, 0]), "3 NUMA nodes for 2 GPUs", id="numa-long"),
        pytest.param(document(links=[]), "0 links for 2 GPUs: the upper triangle holds 1", id="links-short"),
        pytest.param(document(links=["NV2", "SYS"]), "2 links for 2 GPUs", id="links-long"),
        pytest.param(
            document(gpus=[0, 1, 2], numa=[0, 0, 0], links=["SYS", "SYS"]), "2 links for 3 GPUs", id="links-3"
        ),
        pytest.param(document(links=["NVLINK"]), "link 'NVLINK' is none of NV1..NV18", id="unknown-link"),
        pytest.param(document(links=["NV0"]), "link 'NV0' is none of", id="nv0"),
        pytest.param(document(links=[f"NV{MAX_NVLINKS + 1}"]), "link 'NV19' is none of", id="nv-too-many"),
        pytest.param(document(links=["nv2"]), "link 'nv2' is none of", id="lowercase"),
        pytest.param(document(links=["NV\u0664"]), "is none of", id="non-ascii-digit"),
        pytest.param(document(links=["NV-2"]), "is none of", id="nv-negative"),
        pytest.param(document(links=[""]), "link '' is none of", id="empty-link"),
        pytest.param(document(links=["PCI"]), "link 'PCI' is none of", id="pci"),
        pytest.param(document(links=["X"]), "SYS", id="names-accepted-classes"),
    ],
)
def test_every_malformed_value_is_an_annotation_error(value: str, fault: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_topology(value)
    assert str(caught.value).startswith(f"node annotation {TOPOLOGY_KEY}: ")
    assert fault in str(caught.value)


def test_a_malformed_node_annotation_reads_as_an_error() -> None:
    with pytest.raises(AnnotationError, match="GPU indices repeat"):
        node_topology({"metadata": {"annotations": {TOPOLOGY_KEY: document(gpus=[0, 0])}}})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.sampled_from(["NV2", "SYS", "X"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["gpus", "numa", "links", "other"]), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.text(max_size=200) | JSON.map(json.dumps))
def test_any_value_is_a_topology_or_an_annotation_error(text: str) -> None:
    with contextlib.suppress(FitInputError):
        decode_topology(text)


@given(st.lists(st.sampled_from(["SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV12"]), min_size=6, max_size=6))
def test_encode_decode_round_trip(links: list[str]) -> None:
    topology = Topology((5, 0, 2, 7), (1, -1, 0, 0), tuple(parse_link(text) for text in links))
    assert decode_topology(topology.encode()) == topology


def test_build_asks_each_pair_once_in_order() -> None:
    asked: list[tuple[int, int]] = []

    def link(a: int, b: int) -> Link:
        asked.append((a, b))
        return Link("PIX")

    Topology.build([2, 0, 1], [0, 0, 0], link)
    assert asked == [(2, 0), (2, 1), (0, 1)]


def _links(table: dict[tuple[int, int], str], default: str) -> Callable[[int, int], Link]:
    return lambda a, b: parse_link(table.get((a, b), default))


def test_equal_worst_links_go_to_the_set_with_more_and_faster_links() -> None:
    """Every 3-card set here crosses one SYS pair: the sum of the pair ranks decides, and of two
    sets with the best sum the first in the caller's order wins."""
    topology = Topology.build(range(4), [0] * 4, _links({(0, 1): "SYS", (2, 3): "SYS", (1, 3): "NV4"}, "PIX"))
    assert topology.set_score((0, 1, 2)) == (1, 11)
    assert topology.set_score((1, 2, 3)) == (1, 20)
    assert best_set(topology, [0, 1, 2, 3], 3) == (0, 1, 3)
    assert best_set(topology, [3, 2, 1, 0], 3) == (3, 2, 1)  # the caller's order breaks the tie


def _two_switch_groups() -> Topology:
    """16 GPUs, even indices on one NVSwitch group (NV12), odd on another; SYS between them."""
    return Topology.build(
        range(16), [g % 2 for g in range(16)], lambda a, b: parse_link("NV12" if a % 2 == b % 2 else "SYS")
    )


def test_large_choices_are_grown_greedily_to_the_best_set() -> None:
    assert math.comb(16, 8) > EXHAUSTIVE_LIMIT and math.comb(15, 7) > EXHAUSTIVE_LIMIT  # no exhaustive search
    topology = _two_switch_groups()
    assert best_set(topology, list(range(16)), 8) == tuple(range(0, 16, 2))
    assert best_set(topology, list(range(16)), 7, kept=[1]) == tuple(range(3, 16, 2))  # the kept card's group
    assert best_set(topology, [*range(1, 16, 2), 0], 4) == (1, 3, 5, 7)  # preference order breaks the tie
