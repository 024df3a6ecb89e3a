"""The extender's `whole` family over HTTP (docs/whole.md): `nvidia.com/gpu` pods fitted on whole
idle cards, bound with `gpu-index`, booked whether the extender bound them or not; nodes of the
sharing strategies never offered them."""

from __future__ import annotations

from typing import Any

from deviceplugin.fit import keys
from deviceplugin.fit.topology import TOPOLOGY_KEY
from deviceplugin.gpu.topology import PRESETS
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import Obj, StartExtender, create_pod, eventually, gpu_pod, share_node, vgpu_node

GPU = keys.NVIDIA_GPU


def whole_node(
    name: str, gpus: int = 4, *, allocatable: int | None = None, label: bool = True, notes: Obj | None = None
) -> Obj:
    """A node as kubelet posts it for a plugin advertising `nvidia.com/gpu` (`label`: this
    project's daemon, which labels it; without: NVIDIA's own plugin)."""
    capacity = {"cpu": "8", GPU: str(gpus)}
    usable = {"cpu": "8", GPU: str(gpus if allocatable is None else allocatable)}
    meta: Obj = {"name": name, "annotations": dict(notes or {})}
    if label:
        meta["labels"] = {keys.GPU_STRATEGY_LABEL: "whole"}
    return {"metadata": meta, "status": {"capacity": capacity, "allocatable": usable}}


def whole_pod(apiserver: ApiServerEmulator, name: str, count: int, **kwargs: Any) -> Obj:
    return create_pod(apiserver, gpu_pod(name, {GPU: str(count)}, **kwargs))


def refused(result: Obj) -> dict[str, str]:
    return {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}


def bound_index(apiserver: ApiServerEmulator, name: str) -> str:
    pod = apiserver.get("pods", name, "default") or {}
    return str(pod["metadata"]["annotations"][keys.GPU_INDEX])


def test_a_gpu_pod_fits_whole_nodes_only_and_binds_its_cards(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    labelled_share = share_node("share-1")
    labelled_share["metadata"]["labels"] = {keys.GPU_STRATEGY_LABEL: "share"}
    for node in (whole_node("whole-1"), labelled_share, share_node("number-1", memory_resource=False)):
        apiserver.create("nodes", node)
    apiserver.create("nodes", vgpu_node("vgpu-1"))
    ext = start_extender(strategy="whole")
    pod = whole_pod(apiserver, "trainer", 2)
    result = ext.client.filter(pod, ["whole-1", "share-1", "number-1", "vgpu-1"])
    assert result["NodeNames"] == ["whole-1"]
    assert refused(result) == {
        "share-1": "node share-1 runs the share GPU strategy (label volcano.sh/gpu-strategy), "
        "which does not serve nvidia.com/gpu",
        "number-1": "node number-1 runs the number GPU strategy (from what it publishes: no strategy label), "
        "which does not serve nvidia.com/gpu",
        "vgpu-1": "node vgpu-1 runs the vgpu GPU strategy (from what it publishes: no strategy label), "
        "which does not serve nvidia.com/gpu",
    }
    assert ext.client.bind(pod, "whole-1") == ""
    assert bound_index(apiserver, "trainer") == "0,1"
    second = whole_pod(apiserver, "second", 2)
    assert ext.client.bind(second, "whole-1") == ""
    assert bound_index(apiserver, "second") == "2,3"  # the first pod is booked on 0 and 1
    third = whole_pod(apiserver, "third", 1)
    assert refused(ext.client.filter(third, ["whole-1"])) == {
        "whole-1": "pod default/third needs 1 idle GPU(s); the node has 0 idle of 4 (0 unhealthy)"
    }


def test_a_pod_bound_without_the_extender_is_booked_by_count_then_on_the_gpus_it_got(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """kube-scheduler placed it alone (no gpu-index): its two GPUs are not offered again; once the
    node's daemon writes the GPUs kubelet gave it, those are the ones booked."""
    apiserver.create("nodes", whole_node("whole-1"))
    ext = start_extender(strategy="whole")
    whole_pod(apiserver, "plain", 2, node="whole-1")
    view = ext.extender.inventory.view("whole-1")
    assert view is not None
    eventually(lambda: sum(bool(card.pods) for card in view.gpus) == 2)
    three = whole_pod(apiserver, "three", 3)
    assert (
        "needs 3 idle GPU(s); the node has 2 idle of 4"
        in refused(ext.client.filter(three, ["whole-1"]))["whole-1"]
    )
    apiserver.patch("pods", "plain", {"metadata": {"annotations": {keys.GPU_INDEX: "1,3"}}}, "default")
    eventually(lambda: sorted(card.index for card in view.gpus if card.pods) == [1, 3])
    two = whole_pod(apiserver, "two", 2)
    assert ext.client.bind(two, "whole-1") == ""
    assert bound_index(apiserver, "two") == "0,2"


def test_nvidias_own_plugin_node_counts_its_unhealthy_gpus_from_allocatable(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", whole_node("nvidia-1", allocatable=3, label=False))
    ext = start_extender(strategy="whole")
    assert ext.client.filter(whole_pod(apiserver, "three", 3), ["nvidia-1"])["NodeNames"] == ["nvidia-1"]
    assert refused(ext.client.filter(whole_pod(apiserver, "four", 4), ["nvidia-1"])) == {
        "nvidia-1": "pod default/four needs 4 idle GPU(s); the node has 3 idle of 4 (1 unhealthy)"
    }


def test_the_daemon_s_unhealthy_gpus_are_not_given(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", whole_node("whole-1", notes={keys.GPU_UNHEALTHY_IDS: "0"}))
    ext = start_extender(strategy="whole")
    pod = whole_pod(apiserver, "pair", 2)
    assert ext.client.bind(pod, "whole-1") == ""
    assert bound_index(apiserver, "pair") == "1,2"


def test_binpack_prefers_the_node_with_fewer_idle_gpus(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", whole_node("idle"))
    apiserver.create("nodes", whole_node("busy", notes={}))
    whole_pod(apiserver, "resident", 2, node="busy", annotations={keys.GPU_INDEX: "0,1"})
    ext = start_extender(strategy="whole", policy="binpack")
    view = ext.extender.inventory.view("busy")
    assert view is not None
    eventually(lambda: any(card.pods for card in view.gpus))
    scores = ext.client.prioritize(whole_pod(apiserver, "next", 1), ["idle", "busy"])
    assert scores["busy"] > scores["idle"]


def test_a_pod_asking_nvidia_gpus_and_a_sharing_resource_is_refused_naming_both(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", whole_node("whole-1"))
    ext = start_extender(strategy="whole")
    pod = create_pod(apiserver, gpu_pod("mixed", {GPU: "1", keys.GPU_MEMORY: "1024"}))
    result = ext.client.filter(pod, ["whole-1"])
    assert result["NodeNames"] == []
    assert "nvidia.com/gpu (whole); volcano.sh/gpu-memory (share)" in result["Error"]


def test_a_multi_gpu_pod_is_bound_to_the_best_linked_idle_gpus(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """nvlink-pairs (0-1 and 2-3 by NVLink, the rest across sockets) with GPU 1 busy: 2,3 (NV4),
    not the lowest idle indices 0,2 (SYS)."""
    links = {TOPOLOGY_KEY: PRESETS["nvlink-pairs"]().encode()}
    apiserver.create("nodes", whole_node("whole-1", notes=links))
    whole_pod(apiserver, "one", 1, node="whole-1", annotations={keys.GPU_INDEX: "1"})
    ext = start_extender(strategy="whole")
    view = ext.extender.inventory.view("whole-1")
    assert view is not None
    eventually(lambda: any(card.pods for card in view.gpus))
    assert ext.client.bind(whole_pod(apiserver, "pair", 2), "whole-1") == ""
    assert bound_index(apiserver, "pair") == "2,3"
