"""Super-node groups (fit.supernode): reading the group sizes, checking them against the pod and
the job, and where the job's next pod may go so that its groups stay inside super-nodes."""

from __future__ import annotations

import itertools
import random

import pytest

from deviceplugin.fit import GpuState
from deviceplugin.fit.errors import RequestError
from deviceplugin.fit.model import PodUsage
from deviceplugin.fit.supernode import (
    ATOMIC_GROUP_SIZE,
    GROUP_SIZE,
    JOIN,
    METAX_ATOMIC_GROUP_SIZE,
    METAX_GROUP_SIZE,
    WHOLE,
    GroupSizes,
    check_sizes,
    idle_cards,
    place,
    pod_gpus,
    ranked,
    read_sizes,
)
from tests.fit.builders import container, pod

# --- reading the sizes --------------------------------------------------------------------------


def test_no_group_size_is_no_group() -> None:
    assert read_sizes({"volcano.sh/gpu-number": "2"}) is None


def test_our_keys_and_the_metax_aliases_read_alike() -> None:
    ours = read_sizes({GROUP_SIZE: "8", ATOMIC_GROUP_SIZE: "4"})
    metax = read_sizes({METAX_GROUP_SIZE: "8", METAX_ATOMIC_GROUP_SIZE: "4"})
    assert ours == metax == GroupSizes(8, 4)
    assert read_sizes({GROUP_SIZE: "8", METAX_GROUP_SIZE: "8"}) == GroupSizes(8)


def test_a_key_and_its_alias_disagreeing_is_refused_naming_both() -> None:
    with pytest.raises(RequestError, match=f"{GROUP_SIZE} '8' and {METAX_GROUP_SIZE} '4' disagree"):
        read_sizes({GROUP_SIZE: "8", METAX_GROUP_SIZE: "4"})
    with pytest.raises(RequestError, match=f"{ATOMIC_GROUP_SIZE} '2' and {METAX_ATOMIC_GROUP_SIZE} '4'"):
        read_sizes({GROUP_SIZE: "8", ATOMIC_GROUP_SIZE: "2", METAX_ATOMIC_GROUP_SIZE: "4"})


@pytest.mark.parametrize("value", ["0", "-8", "eight", "2.5", "", "8Gi", "\uff11"])
@pytest.mark.parametrize("key", [GROUP_SIZE, METAX_GROUP_SIZE])
def test_a_group_size_that_is_not_a_positive_whole_number_is_refused(key: str, value: str) -> None:
    with pytest.raises(RequestError, match=f"{key} must be a positive whole number of GPUs, not {value!r}"):
        read_sizes({key: value})


@pytest.mark.parametrize("value", [8, ["8"], None])
def test_a_group_size_that_is_not_text_is_refused(value: object) -> None:
    """The API server keeps annotation values strings; a request built otherwise is refused."""
    with pytest.raises(RequestError, match=f"{GROUP_SIZE} must be a positive whole number of GPUs"):
        read_sizes({GROUP_SIZE: value})


@pytest.mark.parametrize("key", [ATOMIC_GROUP_SIZE, METAX_ATOMIC_GROUP_SIZE])
def test_a_bad_atomic_size_is_refused(key: str) -> None:
    with pytest.raises(RequestError, match=f"{key} must be a positive whole number"):
        read_sizes({GROUP_SIZE: "8", key: "0"})


def test_the_atomic_size_alone_is_refused() -> None:
    with pytest.raises(RequestError, match=f"{ATOMIC_GROUP_SIZE} 4 is given without {GROUP_SIZE}"):
        read_sizes({METAX_ATOMIC_GROUP_SIZE: "4"})


# --- a pod's GPUs ---------------------------------------------------------------------------------


def test_a_pods_gpus_are_its_containers_counts_of_any_count_resource() -> None:
    worker = pod(
        containers=[
            container("a", {"volcano.sh/gpu-number": "2"}),
            container("b", requests={"volcano.sh/vgpu-number": "1"}),
            container("c", {"nvidia.com/gpu": 3, "volcano.sh/gpu-memory": "4096"}),
        ],
        init_containers=[container("init", {"volcano.sh/gpu-number": "8"})],
    )
    assert pod_gpus(worker) == 6


def test_memory_alone_is_no_gpu_count() -> None:
    assert pod_gpus(pod(containers=[container("a", {"volcano.sh/gpu-memory": "4096"})])) == 0


def test_a_malformed_count_is_refused_naming_the_container() -> None:
    with pytest.raises(RequestError, match=r"container a: volcano\.sh/gpu-number"):
        pod_gpus(pod(containers=[container("a", {"volcano.sh/gpu-number": "two"})]))


# --- checking the sizes -------------------------------------------------------------------------


def test_sizes_that_fit_the_pod_and_the_job_pass() -> None:
    check_sizes(GroupSizes(8), gpus=2, job_gpus=16, job_pods=8)
    check_sizes(GroupSizes(8, 4), gpus=2, job_gpus=16, job_pods=8)
    check_sizes(GroupSizes(2, 2), gpus=2, job_gpus=2, job_pods=1)


@pytest.mark.parametrize(
    ("sizes", "gpus", "job_gpus", "reason"),
    [
        (GroupSizes(8), 3, 24, f"{GROUP_SIZE} 8 is not a multiple of the pod's 3 GPUs"),
        (
            GroupSizes(8),
            2,
            12,
            f"{GROUP_SIZE} 8 does not divide the job's 12 GPUs [(]6 pods of its pod group[)]",
        ),
        (GroupSizes(8, 4), 8, 16, f"{ATOMIC_GROUP_SIZE} 4 is not a multiple of the pod's 8 GPUs"),
        (GroupSizes(8, 3), 1, 16, f"{ATOMIC_GROUP_SIZE} 3 does not divide the job's 16 GPUs"),
        (GroupSizes(8, 3), 1, 24, f"{ATOMIC_GROUP_SIZE} 3 does not divide {GROUP_SIZE} 8"),
        (GroupSizes(8), 0, 16, f"{GROUP_SIZE} counts GPUs, and the pod asks none by count"),
    ],
)
def test_sizes_that_do_not_fit_are_refused_saying_why(
    sizes: GroupSizes, gpus: int, job_gpus: int, reason: str
) -> None:
    with pytest.raises(RequestError, match=reason):
        check_sizes(sizes, gpus, job_gpus, job_gpus // max(gpus, 1))


# --- free GPUs ------------------------------------------------------------------------------------


def test_only_healthy_cards_holding_no_pod_are_free() -> None:
    used = GpuState(1, "GPU-1", pods={"u": PodUsage("u", "default/p")})
    cards = [GpuState(0, "GPU-0"), used, GpuState(2, "GPU-2", health=False), GpuState(3, "GPU-3")]
    assert idle_cards(cards) == 2


# --- where the next pod may go ----------------------------------------------------------------


def test_a_new_group_starts_only_where_the_free_gpus_hold_it_whole() -> None:
    placement = place({}, {"sn1": 16, "sn2": 7, "sn3": 8}, GroupSizes(8), gpus=2)
    assert placement.allowed == {"sn1", "sn3"}
    assert placement.refusals == {
        "sn2": f"{GROUP_SIZE} 8: a new group of the job needs 8 free GPUs in one super-node; "
        "super-node sn2 has 7"
    }
    assert placement.preferred == {}


def test_an_open_group_is_completed_in_its_super_node_before_a_new_one_starts() -> None:
    placement = place({"sn1": 4}, {"sn1": 12, "sn2": 16}, GroupSizes(8), gpus=2)
    assert placement.allowed == {"sn1"}
    assert placement.refusals == {
        "sn2": f"{GROUP_SIZE} 8: the job's open group in super-node sn1 (4 of 8 GPUs placed) "
        "is completed first"
    }


def test_complete_groups_leave_the_next_one_free_to_start_wherever_it_fits() -> None:
    assert place({"sn1": 8, "sn2": 16}, {"sn1": 8, "sn2": 0, "sn3": 8}, GroupSizes(8), 2).allowed == {
        "sn1",
        "sn3",
    }


def test_a_new_group_beside_an_open_one_it_cannot_join_needs_room_for_both() -> None:
    # sn1's open group needs 2 more GPUs: too few for a 4-GPU pod, which starts a new group
    placement = place({"sn1": 6}, {"sn1": 9, "sn2": 8}, GroupSizes(8), gpus=4)
    assert placement.allowed == {"sn2"}
    assert placement.refusals["sn1"].endswith("needs 10 free GPUs in one super-node; super-node sn1 has 9")


def test_with_an_atomic_size_the_atomic_groups_are_strict_and_the_groups_preferred() -> None:
    placement = place({"sn1": 4}, {"sn1": 12, "sn2": 16}, GroupSizes(8, 4), gpus=2)
    assert placement.allowed == {"sn1", "sn2"}  # the atomic group of 4 in sn1 is complete
    assert placement.preferred == {"sn1": JOIN}  # the group of 8 it started is there

    open_atomic = place({"sn1": 2}, {"sn1": 12, "sn2": 16}, GroupSizes(8, 4), gpus=2)
    assert open_atomic.allowed == {"sn1"}
    assert open_atomic.refusals["sn2"].startswith(
        f"{ATOMIC_GROUP_SIZE} 4: the job's open group in super-node sn1"
    )


def test_a_best_effort_group_that_cannot_stay_together_is_split_not_refused() -> None:
    placement = place({"sn1": 4}, {"sn1": 2, "sn2": 4}, GroupSizes(8, 4), gpus=2)
    assert placement.allowed == {"sn2"}
    assert placement.preferred == {"sn1": JOIN}


def test_a_new_best_effort_group_is_preferred_where_it_fits_whole() -> None:
    placement = place({}, {"sn1": 6, "sn2": 8, "sn3": 16}, GroupSizes(8, 4), gpus=2)
    assert placement.allowed == {"sn1", "sn2", "sn3"}
    assert placement.preferred == {"sn2": WHOLE, "sn3": WHOLE}
    split = place({"sn1": 4, "sn2": 4}, {"sn1": 8, "sn2": 4, "sn3": 8}, GroupSizes(8, 4), gpus=2)
    assert split.preferred == {"sn1": WHOLE, "sn3": WHOLE}  # 8 placed: the split group is done


def test_ranking_puts_every_node_of_a_preferred_super_node_first_and_keeps_their_order() -> None:
    scores = [("a", 10), ("b", 0), ("c", 4), ("d", 9), ("e", 0)]
    out = dict(ranked(scores, [0, JOIN, WHOLE, WHOLE, 0], top=10))
    assert out["b"] > out["d"] > out["c"] > out["a"] >= out["e"]
    assert all(0 <= value <= 10 for value in out.values())
    assert dict(ranked([("x", 10)], [JOIN], 10)) == {"x": 10}


# --- a job placed pod by pod, the scheduler choosing adversarially ----------------------------


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize(("gpus", "size"), [(2, 8), (1, 4), (4, 8), (2, 16)])
def test_every_group_of_a_job_lies_inside_one_super_node(seed: int, gpus: int, size: int) -> None:
    """Four super-nodes of two 8-GPU nodes, some cards taken already; a job of 32 GPUs placed one
    pod at a time on any node the rule allows and the pod fits (chosen at random): when the job is
    placed, each super-node holds a whole number of its groups."""
    chance = random.Random(seed)
    nodes = {f"sn{s}-{n}": f"sn{s}" for s, n in itertools.product(range(4), range(2))}
    free_on = {node: 8 - chance.choice([0, 0, 1, 2, 4]) for node in nodes}
    placed: dict[str, int] = {}
    for _ in range(32 // gpus):
        free = {s: sum(f for node, f in free_on.items() if nodes[node] == s) for s in set(nodes.values())}
        allowed = place(placed, free, GroupSizes(size), gpus).allowed
        fitting = [node for node in nodes if nodes[node] in allowed and free_on[node] >= gpus]
        if not fitting:
            break  # the job cannot be placed whole: a gang would bind none of it
        node = chance.choice(fitting)
        free_on[node] -= gpus
        placed[nodes[node]] = placed.get(nodes[node], 0) + gpus
    else:
        assert all(count % size == 0 for count in placed.values()), placed
        return
    assert sum(placed.values()) < 32
