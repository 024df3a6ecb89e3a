"""Super-node groups through the extender over HTTP (docs/supernode.md): the pods of a job with
`gpu-group-size` are placed so that each group of that many GPUs lies inside one super-node (nodes
labelled `volcano.sh/super-node`); with `atomic-gpu-group-size` only the atomic groups must, and
the groups are preferred by score. kube-scheduler's part is played here: filter, prioritize, the
best score (ties: the last name, and the spread policy, both pulling pods apart), bind."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from deviceplugin.fit.supernode import (
    ATOMIC_GROUP_SIZE,
    GROUP_SIZE,
    METAX_ATOMIC_GROUP_SIZE,
    METAX_GROUP_SIZE,
    SUPER_NODE_LABEL,
)
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Obj,
    Running,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    share_node,
    vgpu_node,
)

SUPER_NODES = {"east-1": "east", "east-2": "east", "west-1": "west", "west-2": "west"}
NODES = [*SUPER_NODES, "loner"]  # loner: 8 GPUs, no super-node label
GROUP = "scheduling.k8s.io/group-name"


def whole_node(name: str) -> Obj:
    """A node of NVIDIA's resource (the `whole` strategy): 8 GPUs."""
    resources = {"cpu": "8", "nvidia.com/gpu": "8"}
    return {"metadata": {"name": name}, "status": {"capacity": resources, "allocatable": dict(resources)}}


NODE_OF = {
    "number": lambda name: share_node(name, gpus=8, memory_resource=False),
    "vgpu": lambda name: vgpu_node(name, gpus=8),
    "whole": whole_node,
}
ASKS = {
    "number": {"volcano.sh/gpu-number": "2"},
    "vgpu": {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "1000"},
    "whole": {"nvidia.com/gpu": "2"},
}


def add_nodes(apiserver: ApiServerEmulator, strategy: str = "number") -> None:
    """Four 8-GPU nodes in two super-nodes, and one in none."""
    for name in NODES:
        node = NODE_OF[strategy](name)
        if name in SUPER_NODES:
            node["metadata"]["labels"] = {SUPER_NODE_LABEL: SUPER_NODES[name]}
        apiserver.create("nodes", node)


def occupy(apiserver: ApiServerEmulator, node: str, cards: str) -> None:
    """Another tenant holding `cards` (gpu-index) of the node."""
    count = str(len(cards.split(",")))
    pod = gpu_pod(f"tenant-{node}", {"volcano.sh/gpu-number": count}, node=node)
    pod["metadata"]["annotations"] = {"volcano.sh/gpu-index": cards}
    create_pod(apiserver, pod)


def job(
    apiserver: ApiServerEmulator, name: str, pods: int, sizes: Mapping[str, str], strategy: str = "number"
) -> list[Obj]:
    """The job's pods, each asking 2 GPUs of `strategy`, in pod group `name`, annotated `sizes`."""
    return [
        create_pod(apiserver, gpu_pod(f"{name}-{i}", ASKS[strategy], annotations={GROUP: name, **sizes}))
        for i in range(pods)
    ]


def schedule(ext: Running, pod: Obj) -> str:
    """One scheduling cycle: the node the pod is bound to."""
    result = ext.client.filter(pod, NODES)
    assert result["Error"] == "" and result["NodeNames"], result
    scores = ext.client.prioritize(pod, result["NodeNames"])
    passed: list[str] = result["NodeNames"]
    node = max(passed, key=lambda name: (scores[name], name))
    assert ext.client.bind(pod, node) == ""
    return node


def super_nodes_of(nodes: list[str]) -> list[str]:
    return [SUPER_NODES[node] for node in nodes]


@pytest.mark.parametrize("strategy", ["number", "vgpu", "whole"])
def test_each_group_of_an_8_pod_job_lands_in_one_super_node(
    apiserver: ApiServerEmulator, start_extender: StartExtender, strategy: str
) -> None:
    add_nodes(apiserver, strategy)
    pods = job(apiserver, "train", 8, {GROUP_SIZE: "8"}, strategy)
    ext = start_extender(strategy=strategy, policy="spread")

    first = schedule(ext, pods[0])
    opened = SUPER_NODES[first]
    result = ext.client.filter(pods[1], NODES)
    other = next(name for name in SUPER_NODES if SUPER_NODES[name] != opened)
    assert sorted(result["NodeNames"]) == sorted(n for n in SUPER_NODES if SUPER_NODES[n] == opened)
    assert result["FailedNodes"][other] == (
        f"{GROUP_SIZE} 8: the job's open group in super-node {opened} (2 of 8 GPUs placed) is completed first"
    )
    assert f"no {SUPER_NODE_LABEL} label" in result["FailedAndUnresolvableNodes"]["loner"]

    nodes = [first] + [schedule(ext, pod) for pod in pods[1:]]
    groups = super_nodes_of(nodes)
    assert len(set(groups[:4])) == 1 and len(set(groups[4:])) == 1, nodes


def test_the_metax_keys_place_the_job_alike(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    add_nodes(apiserver)
    pods = job(apiserver, "train", 8, {METAX_GROUP_SIZE: "8"})
    ext = start_extender(strategy="number", policy="spread")
    groups = super_nodes_of([schedule(ext, pod) for pod in pods])
    assert len(set(groups[:4])) == 1 and len(set(groups[4:])) == 1, groups


def test_a_pod_of_a_complete_group_that_is_replaced_goes_back_to_its_super_node(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    add_nodes(apiserver)
    pods = job(apiserver, "train", 4, {GROUP_SIZE: "4"})
    ext = start_extender(strategy="number", policy="spread")
    nodes = [schedule(ext, pod) for pod in pods]
    left = SUPER_NODES[nodes[3]]  # the second group's super-node
    apiserver.delete("pods", "train-3", "default")
    replacement = create_pod(
        apiserver,
        gpu_pod("train-3b", {"volcano.sh/gpu-number": "2"}, annotations={GROUP: "train", GROUP_SIZE: "4"}),
    )
    eventually(
        lambda: (
            set(ext.client.filter(replacement, NODES)["NodeNames"])
            == {n for n in SUPER_NODES if SUPER_NODES[n] == left}
        )
    )


def test_strict_groups_that_no_super_node_holds_are_refused_naming_the_size(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    add_nodes(apiserver)
    for node, cards in (("east-1", "0,1,2,3,4,5"), ("east-2", "0,1,2,3,4,5"), ("west-1", "0,1,2,3,4,5,6,7")):
        occupy(apiserver, node, cards)
    occupy(apiserver, "west-2", "0,1,2,3")
    pods = job(apiserver, "train", 4, {GROUP_SIZE: "8"})
    ext = start_extender(strategy="number")

    result = ext.client.filter(pods[0], NODES)

    assert result["NodeNames"] == []
    assert result["FailedNodes"]["east-1"] == (
        f"{GROUP_SIZE} 8: a new group of the job needs 8 free GPUs in one super-node; super-node east has 4"
    )
    assert result["FailedNodes"]["west-2"].endswith("super-node west has 4")


def test_with_an_atomic_size_the_job_splits_where_its_groups_cannot_stay_together(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """The same cluster: 4 free GPUs in each super-node. Groups of 8 are best effort now; each
    atomic group of 4 still lies inside one super-node."""
    add_nodes(apiserver)
    for node, cards in (("east-1", "0,1,2,3,4,5"), ("east-2", "0,1,2,3,4,5"), ("west-1", "0,1,2,3,4,5,6,7")):
        occupy(apiserver, node, cards)
    occupy(apiserver, "west-2", "0,1,2,3")
    pods = job(apiserver, "train", 4, {GROUP_SIZE: "8", ATOMIC_GROUP_SIZE: "4"})
    ext = start_extender(strategy="number", policy="spread")

    groups = super_nodes_of([schedule(ext, pod) for pod in pods])

    assert groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2], groups


def test_with_an_atomic_size_the_group_is_kept_together_by_score(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    add_nodes(apiserver)
    pods = job(apiserver, "train", 8, {METAX_GROUP_SIZE: "8", METAX_ATOMIC_GROUP_SIZE: "4"})
    ext = start_extender(strategy="number", policy="spread")
    nodes = [schedule(ext, pod) for pod in pods[:2]]  # one atomic group: the next may start anywhere

    result = ext.client.filter(pods[2], NODES)
    scores = ext.client.prioritize(pods[2], result["NodeNames"])

    assert sorted(result["NodeNames"]) == sorted(SUPER_NODES)  # no refusal for the group of 8
    opened = SUPER_NODES[nodes[0]]
    inside = [scores[n] for n in SUPER_NODES if SUPER_NODES[n] == opened]
    outside = [scores[n] for n in SUPER_NODES if SUPER_NODES[n] != opened]
    assert min(inside) > max(outside), scores
    groups = super_nodes_of(nodes + [schedule(ext, pod) for pod in pods[2:]])
    assert len(set(groups[:4])) == 1 and len(set(groups[4:])) == 1, groups


@pytest.mark.parametrize(
    ("sizes", "reason"),
    [
        ({GROUP_SIZE: "3"}, f"{GROUP_SIZE} 3 is not a multiple of the pod's 2 GPUs"),
        ({GROUP_SIZE: "6"}, f"{GROUP_SIZE} 6 does not divide the job's 8 GPUs (4 pods of its pod group)"),
        ({GROUP_SIZE: "0"}, f"{GROUP_SIZE} must be a positive whole number of GPUs, not '0'"),
        ({METAX_GROUP_SIZE: "four"}, f"{METAX_GROUP_SIZE} must be a positive whole number of GPUs"),
        ({GROUP_SIZE: "8", METAX_GROUP_SIZE: "4"}, f"{GROUP_SIZE} '8' and {METAX_GROUP_SIZE} '4' disagree"),
        (
            {GROUP_SIZE: "8", ATOMIC_GROUP_SIZE: "6"},
            f"{ATOMIC_GROUP_SIZE} 6 does not divide the job's 8 GPUs",
        ),
        ({GROUP_SIZE: "4", ATOMIC_GROUP_SIZE: "8"}, f"{ATOMIC_GROUP_SIZE} 8 does not divide {GROUP_SIZE} 4"),
        ({ATOMIC_GROUP_SIZE: "4"}, f"{ATOMIC_GROUP_SIZE} 4 is given without {GROUP_SIZE}"),
    ],
)
def test_group_sizes_that_cannot_be_served_are_refused_saying_why(
    apiserver: ApiServerEmulator, start_extender: StartExtender, sizes: dict[str, str], reason: str
) -> None:
    add_nodes(apiserver)
    pods = job(apiserver, "train", 4, sizes)
    ext = start_extender(strategy="number")

    result = ext.client.filter(pods[0], NODES)

    assert reason in result["Error"] and result["NodeNames"] == [], result
    assert set(ext.client.prioritize(pods[0], NODES)) == set(NODES)  # scores still answered


def test_a_group_size_needs_a_pod_group(apiserver: ApiServerEmulator, start_extender: StartExtender) -> None:
    add_nodes(apiserver)
    pod = create_pod(
        apiserver, gpu_pod("lone", {"volcano.sh/gpu-number": "2"}, annotations={GROUP_SIZE: "2"})
    )
    ext = start_extender(strategy="number")
    assert "needs the pod's pod group" in ext.client.filter(pod, NODES)["Error"]


def test_pods_without_a_group_size_ignore_super_nodes(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    add_nodes(apiserver)
    pods = job(apiserver, "plain", 2, {})
    ext = start_extender(strategy="number")
    assert sorted(ext.client.filter(pods[0], NODES)["NodeNames"]) == sorted(NODES)


def test_compat_volcano_reads_no_group_size(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Super-node groups are not Volcano's deviceshare: compat volcano places the pods as Volcano."""
    add_nodes(apiserver)
    pods = job(apiserver, "train", 4, {GROUP_SIZE: "3"})
    ext = start_extender(strategy="number", compat="volcano")
    result = ext.client.filter(pods[0], NODES)
    assert (result["Error"], sorted(result["NodeNames"])) == ("", sorted(NODES))
