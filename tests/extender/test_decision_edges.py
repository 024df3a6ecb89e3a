"""Edges of filter, prioritize and bind that mutation testing of extender/service.py found unguarded:
an unusable node ahead of a usable one, a malformed or GPU-less pod at prioritize, and the names
(node, pod uid) that refusals must carry."""

from __future__ import annotations

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import StartExtender, create_pod, gpu_pod, memory_pod, share_node


def test_prioritize_scores_every_node_after_an_unusable_one(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """A node the extender cannot use (unknown, no GPUs) scores 0 and the nodes after it are
    still scored: the scheduler gets one score per node it asked about."""
    apiserver.create("nodes", share_node("cpu-only", gpus=0))
    apiserver.create("nodes", share_node("gpu", gpus=1, memory=16000))
    ext = start_extender(strategy="share", policy="binpack")
    pod = create_pod(apiserver, memory_pod("new", 4000))
    # binpack on the card after placement: 4000/16000 = 25 -> 3
    scores = ext.client.prioritize(pod, ["unknown", "cpu-only", "gpu"])
    assert scores == {"unknown": 0, "cpu-only": 0, "gpu": 3}


def test_prioritize_of_a_malformed_or_gpu_less_pod_scores_every_node_zero(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Filter already refused the malformed pod with an error; prioritize answers (no 500) and
    prefers no node for it, nor for a pod that asks for no GPU."""
    apiserver.create("nodes", share_node("gpu", gpus=1, memory=16000))
    ext = start_extender(strategy="share", policy="binpack")
    odd = create_pod(apiserver, gpu_pod("odd", {"volcano.sh/gpu-memory": "1.5"}))
    cpu = create_pod(apiserver, gpu_pod("cpu-job"))
    assert ext.client.prioritize(odd, ["gpu"]) == {"gpu": 0}
    assert ext.client.prioritize(cpu, ["gpu", "anything"]) == {"gpu": 0, "anything": 0}


def test_filter_and_bind_name_the_node_they_do_not_know(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("gpu"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    result = ext.client.filter(pod, ["gpu", "ghost"])
    assert result["NodeNames"] == ["gpu"]
    assert "node ghost is not in the extender's node cache" in result["FailedAndUnresolvableNodes"]["ghost"]
    assert "node ghost is not in the extender's node cache" in ext.client.bind(pod, "ghost")


def test_a_bind_of_an_unknown_pod_names_its_uid(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("gpu"))
    ext = start_extender(strategy="share")
    ghost = {"metadata": {"name": "ghost", "namespace": "default", "uid": "no-such-uid"}}
    assert "pod default/ghost (uid no-such-uid) is not known" in ext.client.bind(ghost, "gpu")


def test_a_bind_without_a_pod_uid_finds_the_pod_by_namespace_and_name(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """ExtenderBindingArgs.PodUID may be empty: the pod is then looked up by namespace and name."""
    apiserver.create("nodes", share_node("gpu"))
    ext = start_extender(strategy="share")
    create_pod(apiserver, memory_pod("new", 1000))
    reply = ext.client.post("/bind", {"PodName": "new", "PodNamespace": "default", "Node": "gpu"})
    assert reply.status == 200 and reply.body["Error"] == "", reply.body
    stored = apiserver.get("pods", "new", "default")
    assert stored is not None and stored["spec"]["nodeName"] == "gpu"
    assert stored["metadata"]["annotations"]["volcano.sh/gpu-index"] == "0"


def test_under_volcano_compat_a_pod_mixing_strategies_is_fitted_as_volcano_does(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Volcano does not check that a pod asks for one strategy's resources: with compat="volcano"
    the share extender fits the pod's gpu-memory and ignores its vgpu-number."""
    apiserver.create("nodes", share_node("gpu"))
    ext = start_extender(strategy="share", compat="volcano")
    limits = {"volcano.sh/gpu-memory": "1024", "volcano.sh/vgpu-number": "1"}
    pod = create_pod(apiserver, gpu_pod("mixed", limits))
    result = ext.client.filter(pod, ["gpu"])
    assert (result["NodeNames"], result["Error"]) == (["gpu"], "")
