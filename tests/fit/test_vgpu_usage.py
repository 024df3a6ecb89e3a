"""vGPU node view: which nodes have vGPUs, usage rebuilt from pods' `vgpu-ids-new`
(semantics reference §3.2, §3.3, §3.10; B17, B18, B19), and the bind annotations."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from deviceplugin.fit import (
    VGPU_BIND_KEYS,
    Compat,
    FitResult,
    GpuState,
    PodDevicesError,
    PodFormatError,
    add_vgpu_pod,
    decode_pod_devices,
    fit_vgpu,
    holds_gpus,
    parse_vgpu_requests,
    remove_vgpu_pod,
    vgpu_bind_annotations,
    vgpu_gpus,
    vgpu_release_keys,
)
from tests.fit.builders import container, gpus, pod, vgpu_node

BOTH: list[Compat] = [None, "volcano"]
IDS = "volcano.sh/vgpu-ids-new"
REGISTER = "GPU-a,10,16384,NVIDIA-Tesla T4,true,hami-core:GPU-b,4,32768,NVIDIA-Tesla V100,false,hami-core:"


def holder(name: str, value: str, **kwargs: Any) -> dict[str, Any]:
    return pod(name, [container("main")], annotations={IDS: value}, **kwargs)


@pytest.mark.parametrize("compat", BOTH)
def test_inventory_from_the_register_annotation(compat: Compat) -> None:
    cards = vgpu_gpus(vgpu_node(REGISTER), compat=compat)
    assert [(c.index, c.uuid, c.split_count, c.memory, c.type, c.health) for c in cards] == [
        (0, "GPU-a", 10, 16384, "NVIDIA-Tesla T4", True),
        (1, "GPU-b", 4, 32768, "NVIDIA-Tesla V100", False),
    ]


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    "allocatable",
    [
        {"volcano.sh/vgpu-number": "0", "volcano.sh/vgpu-memory": "10", "volcano.sh/vgpu-cores": "10"},
        {"volcano.sh/vgpu-number": "10", "volcano.sh/vgpu-memory": "10"},
        {},
    ],
    ids=["zero-count", "no-cores", "none"],
)
def test_no_vgpus_without_allocatable_resources(compat: Compat, allocatable: dict[str, str]) -> None:
    assert vgpu_gpus(vgpu_node(REGISTER, allocatable=allocatable), compat=compat) == []


@pytest.mark.parametrize("compat", BOTH)
def test_no_register_annotation_no_vgpus(compat: Compat) -> None:
    node = vgpu_node(REGISTER)
    del node["metadata"]["annotations"]["volcano.sh/node-vgpu-register"]
    assert vgpu_gpus(node, compat=compat) == []


def test_malformed_register_is_an_error_by_default_and_no_vgpus_in_volcano() -> None:
    node = vgpu_node("GPU-a,10,16384,NVIDIA-T4,true:GPU-b,10,oops:")
    assert vgpu_gpus(node, compat="volcano") == []
    with pytest.raises(ValueError, match="GPU 1 'GPU-b,10,oops'"):
        vgpu_gpus(node)


@pytest.mark.parametrize("compat", BOTH)
def test_usage_counters_and_per_pod_entries(compat: Compat) -> None:
    pods = [
        holder("a", "GPU-a,NVIDIA,1000,10:", labels={"app": "x"}),
        holder("b", "GPU-a,NVIDIA,2000,20:;GPU-b,NVIDIA,3000,0:"),
    ]
    pods[0]["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = "g"
    cards = vgpu_gpus(vgpu_node(REGISTER), pods, compat=compat)
    a, b = cards
    assert (a.used_num, a.used_memory, a.used_cores) == (2, 3000, 30)
    assert (b.used_num, b.used_memory, b.used_cores) == (1, 3000, 0)
    entry = a.pods["uid-a"]
    assert (entry.name, entry.memory, entry.cores, entry.group, dict(entry.labels)) == (
        "default/a",
        1000,
        10,
        "default/g",
        {"app": "x"},
    )
    assert set(b.pods) == {"uid-b"}


@pytest.mark.parametrize("compat", BOTH)
def test_adding_twice_counts_once_and_remove_frees(compat: Compat) -> None:
    cards = gpus(16000)
    p = holder("a", "GPU-0,NVIDIA,1000,10:")
    add_vgpu_pod(cards, p, compat)
    snapshot = copy.deepcopy(cards)
    add_vgpu_pod(cards, p, compat)
    assert cards == snapshot
    remove_vgpu_pod(cards, "uid-a", compat)
    remove_vgpu_pod(cards, "uid-a", compat)  # unknown now: no effect
    assert (cards[0].used_num, cards[0].used_memory, cards[0].used_cores, cards[0].pods) == (0, 0, 0, {})


@pytest.mark.parametrize("compat", BOTH)
def test_a_pod_booked_on_one_idle_card_leaves_every_other_idle_card_empty(compat: Compat) -> None:
    """Idle cards share one empty map of pods: booking on one must not show on the others, on
    this node or another, before or after the card has been emptied once."""
    node, other = gpus(16000, 16000), gpus(16000)
    for _ in range(2):
        add_vgpu_pod(node, holder("a", "GPU-0,NVIDIA,1000,10:"), compat)
        assert (list(node[0].pods), list(node[1].pods), list(other[0].pods)) == (["uid-a"], [], [])
        add_vgpu_pod(node, holder("b", "GPU-0,NVIDIA,2000,0:"), compat)
        remove_vgpu_pod(node, "uid-a", compat)
        assert (list(node[0].pods), node[0].used_memory) == (["uid-b"], 2000)
        remove_vgpu_pod(node, "uid-b", compat)
        assert [(card.pods, card.used_num, card.used_memory) for card in node + other] == [({}, 0, 0)] * 3


def test_default_re_add_replaces_changed_devices() -> None:
    cards = gpus(16000, 16000)
    add_vgpu_pod(cards, holder("a", "GPU-0,NVIDIA,1000,10:"))
    add_vgpu_pod(cards, holder("a", "GPU-1,NVIDIA,2000,0:"))
    assert [(c.used_num, c.used_memory) for c in cards] == [(0, 0), (1, 2000)]


@pytest.mark.parametrize(("compat", "expected"), [(None, (2, 3000, 30)), ("volcano", (1, 1000, 10))])
def test_two_containers_on_one_card(compat: Compat, expected: tuple[int, int, int]) -> None:
    """B19: Volcano's AddPod is a no-op for a pod already on the card."""
    cards = gpus(16000)
    add_vgpu_pod(cards, holder("a", "GPU-0,NVIDIA,1000,10:;GPU-0,NVIDIA,2000,20:"), compat)
    assert (cards[0].used_num, cards[0].used_memory, cards[0].used_cores) == expected


@pytest.mark.parametrize(("compat", "booked_on"), [(None, "GPU-10"), ("volcano", "GPU-1")])
def test_device_uuid_matching(compat: Compat, booked_on: str) -> None:
    """B17: Volcano matches the first card whose UUID is a substring of the device's."""
    cards = [GpuState(index=0, uuid="GPU-1", memory=1000), GpuState(index=1, uuid="GPU-10", memory=1000)]
    add_vgpu_pod(cards, holder("a", "GPU-10,NVIDIA,100,0:"), compat)
    assert [c.uuid for c in cards if c.pods] == [booked_on]


@pytest.mark.parametrize("compat", BOTH)
def test_devices_of_other_nodes_are_ignored(compat: Compat) -> None:
    cards = gpus(16000)
    add_vgpu_pod(cards, holder("a", "GPU-elsewhere,NVIDIA,100,0:"), compat)
    assert cards[0].pods == {}


def test_pods_without_the_annotation_hold_nothing() -> None:
    cards = gpus(16000)
    add_vgpu_pod(cards, pod("plain", [container("main")]))
    assert cards[0].used_num == 0


def test_undecodable_annotation_is_an_error_by_default_and_skipped_in_volcano() -> None:
    bad = holder("a", "GPU-0,NVIDIA,1000:GPU-0,NVIDIA,500,5:")
    with pytest.raises(PodDevicesError, match="container 0 device 0"):
        add_vgpu_pod(gpus(16000), bad)
    cards = gpus(16000)
    add_vgpu_pod(cards, bad, "volcano")
    assert (cards[0].used_num, cards[0].used_memory) == (1, 500)


def test_pod_without_uid_is_rejected() -> None:
    nameless = holder("a", "GPU-0,NVIDIA,1000,0:")
    del nameless["metadata"]["uid"]
    with pytest.raises(PodFormatError, match=r"has no metadata\.uid"):
        add_vgpu_pod(gpus(16000), nameless)


@pytest.mark.parametrize(
    ("phase", "deleting", "default", "volcano"),
    [
        ("Running", False, True, True),
        ("Pending", False, True, True),
        ("Running", True, True, False),  # terminating: still running (B18); Volcano: Releasing
        ("Pending", True, True, False),
        ("Unknown", True, True, True),  # Volcano books Unknown even while deleting
        ("", True, True, True),
        ("Succeeded", False, False, False),  # Volcano's cache never adds finished pods
        ("Failed", True, False, False),
    ],
)
def test_which_pods_hold_gpus(phase: str, deleting: bool, default: bool, volcano: bool) -> None:
    p = holder("a", "GPU-a,NVIDIA,1000,0:", phase=phase, deleting=deleting)
    assert holds_gpus(p) is default
    assert holds_gpus(p, "volcano") is volcano
    for compat, expected in ((None, default), ("volcano", volcano)):
        cards = vgpu_gpus(vgpu_node(REGISTER), [p], compat=compat)  # type: ignore[arg-type]
        assert (cards[0].used_memory == 1000) is expected


@pytest.mark.parametrize("compat", BOTH)
def test_bind_annotations_round_trip(compat: Compat) -> None:
    cards = gpus(16000, 16000)
    p = pod(
        "job",
        [
            container("a", {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "1000"}),
            container("sidecar"),
            container("b", {"volcano.sh/vgpu-memory": "500", "volcano.sh/vgpu-cores": "30"}),
        ],
    )
    result = fit_vgpu(cards, parse_vgpu_requests(p, compat=compat), p, "binpack", compat)
    notes = vgpu_bind_annotations(result, "node-7", now_s=1_780_000_000)
    assert notes == {
        "volcano.sh/vgpu-node": "node-7",
        "volcano.sh/vgpu-time": "1780000000",
        "volcano.sh/vgpu-ids-new": "GPU-0,NVIDIA,1000,0:GPU-1,NVIDIA,1000,0:;GPU-0,NVIDIA,500,30:",
        "volcano.sh/devices-to-allocate": "GPU-0,NVIDIA,1000,0:GPU-1,NVIDIA,1000,0:;GPU-0,NVIDIA,500,30:",
        "volcano.sh/bind-phase": "allocating",
        "volcano.sh/bind-time": "1780000000",
    }
    decoded = decode_pod_devices(notes["volcano.sh/vgpu-ids-new"])
    assert [[(d.uuid, d.memory, d.cores) for d in c] for c in decoded] == [
        [(d.uuid, d.memory, d.cores) for d in c] for c in result.devices
    ]
    # Booking the bound pod makes the next fit see it.
    p["metadata"]["annotations"].update(notes)
    add_vgpu_pod(cards, p, compat)
    # B19: two containers on GPU-0 book twice by default, once in Volcano.
    expected = [(2, 1500), (1, 1000)] if compat is None else [(1, 1000), (1, 1000)]
    assert [(c.used_num, c.used_memory) for c in cards] == expected


@pytest.mark.parametrize(
    ("phase", "dropped"),
    [
        ("allocating", VGPU_BIND_KEYS),
        ("failed", VGPU_BIND_KEYS),
        (None, VGPU_BIND_KEYS),
        ("success", ()),  # the plugin owns them once the pod runs
    ],
)
def test_release_keys(phase: str | None, dropped: tuple[str, ...]) -> None:
    notes = {} if phase is None else {"volcano.sh/bind-phase": phase}
    assert vgpu_release_keys(notes) == dropped
    assert set(VGPU_BIND_KEYS) == set(vgpu_bind_annotations(FitResult(ok=True), "n", 0))
