"""Strategy-aware placement end to end (issue 19 item 1): real daemons (one per node, each with its
kubelet emulator and the node status kubelet would post) publish their nodes to the API-server
emulator; the extender places pods from what they published.

A share-mode node advertises `volcano.sh/gpu-number` too (the card count Volcano derives memory
per card from), but no device plugin serves that resource there: kubelet admits a `gpu-number` pod
on it without asking any plugin, and the container gets no GPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from deviceplugin.fit import keys
from deviceplugin.fit.families import family_of
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import VgpuConfig
from deviceplugin.kube.api import Kube
from deviceplugin.plugin.devices import RESOURCES
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from kubesim.nodestatus import NodeStatusReporter
from tests.daemons import Daemon, eventually
from tests.extender.conftest import StartExtender, create_pod, gpu_pod, share_node, vgpu_node
from tests.sim.kubectl import MISSING, cells, find_kubectl, kubectl_for

SHARE, NUMBER, VGPU = "gpu-share-1", "gpu-number-1", "gpu-vgpu-1"
STRATEGIES: dict[str, Strategy] = {SHARE: "share", NUMBER: "number", VGPU: "vgpu"}


@dataclass
class GpuNode:
    name: str
    kubelet: KubeletEmulator
    daemon: Daemon


@contextmanager
def gpu_node(apiserver: ApiServerEmulator, kube: Kube, root: Path, name: str) -> Iterator[GpuNode]:
    """A node running the daemon in its strategy, with 2 fake GPUs of 10989 MiB."""
    directory = root / name
    (directory / "plugins").mkdir(parents=True)
    (directory / "hook").mkdir()
    apiserver.create("nodes", {"metadata": {"name": name}})
    status = NodeStatusReporter(name, kube)
    pod_resources = directory / "pod-resources.sock"
    kubelet = KubeletEmulator(
        directory / "plugins", pod_resources_socket=pod_resources, listener=status.kubelet_event
    )
    with ExitStack() as stack:
        kubelet.start()
        stack.callback(kubelet.stop)
        status.start()
        stack.callback(status.stop)
        daemon = Daemon(
            directory / "plugins",
            *("--node-name", name, "--gpu-strategy", STRATEGIES[name], "--fake-gpus", "2x10989"),
            *("--state-dir", str(directory / "state"), "--pod-resources-socket", str(pod_resources)),
            *("--hook-path", str(directory / "hook")),
            *("--kubeconfig", str(apiserver.write_kubeconfig(root / "kubeconfig"))),
        )
        stack.callback(daemon.stop)
        yield GpuNode(name, kubelet, daemon)


def published(apiserver: ApiServerEmulator, name: str) -> bool:
    """The node shows every resource its daemon serves with its devices counted (kubelet first posts a
    newly registered resource as 0), its label and its two GPUs."""
    node = apiserver.get("nodes", name) or {}
    allocatable = node.get("status", {}).get("allocatable") or {}
    served = [resource.name for resource in RESOURCES[STRATEGIES[name]]]
    labelled = keys.GPU_STRATEGY_LABEL in (node.get("metadata", {}).get("labels") or {})
    # and what the daemon itself writes (its GPUs' capacity, the vGPU register) in other requests
    cards = len(family_of(STRATEGIES[name]).node_gpus(node, VgpuConfig(), None))
    counted = all(int(allocatable.get(resource, "0")) > 0 for resource in served)
    return labelled and counted and cards == 2


@pytest.fixture
def cluster(apiserver: ApiServerEmulator, kube: Kube, workdir: Path) -> Iterator[dict[str, GpuNode]]:
    with ExitStack() as stack:
        nodes = {name: stack.enter_context(gpu_node(apiserver, kube, workdir, name)) for name in STRATEGIES}
        for name, node in nodes.items():
            eventually(partial(published, apiserver, name), node.daemon)
        yield nodes


def number_pod(apiserver: ApiServerEmulator, name: str, count: int = 1) -> dict[str, object]:
    return create_pod(apiserver, gpu_pod(name, {keys.GPU_NUMBER: str(count)}))


def test_a_gpu_number_pod_is_offered_only_the_node_running_the_number_strategy(
    apiserver: ApiServerEmulator, cluster: dict[str, GpuNode], start_extender: StartExtender
) -> None:
    """Issue 19: the number extender accepted the share node (it publishes gpu-number capacity)
    and the pod bound there got no GPU env."""
    ext = start_extender(strategy="number")
    pod = number_pod(apiserver, "whole")
    result = ext.client.filter(pod, list(STRATEGIES))
    assert result["NodeNames"] == [NUMBER], result
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    assert refused.keys() == {SHARE, VGPU}
    assert refused[SHARE] == (
        f"node {SHARE} runs the share GPU strategy (label volcano.sh/gpu-strategy), "
        "which does not serve volcano.sh/gpu-number"
    )
    assert ext.client.bind(pod, NUMBER) == ""
    bound = apiserver.get("pods", "whole", "default")
    assert bound is not None
    admission = cluster[NUMBER].kubelet.admit(bound)
    assert admission.admitted, admission
    visible = admission.allocation("main", keys.GPU_NUMBER).envs["NVIDIA_VISIBLE_DEVICES"]
    assert visible.startswith("GPU-")


POD_OF = {
    "share": {keys.GPU_MEMORY: "1024"},
    "number": {keys.GPU_NUMBER: "1"},
    "vgpu": {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "1024"},
}


def refused(result: dict[str, object]) -> dict[str, str]:
    failed = result["FailedNodes"], result["FailedAndUnresolvableNodes"]
    return {name: why for part in failed if isinstance(part, dict) for name, why in part.items()}


@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
def test_each_strategys_pods_are_offered_only_its_nodes(
    apiserver: ApiServerEmulator, cluster: dict[str, GpuNode], start_extender: StartExtender, strategy: str
) -> None:
    ext = start_extender(strategy=strategy)
    pod = create_pod(apiserver, gpu_pod("p", POD_OF[strategy]))
    result = ext.client.filter(pod, list(STRATEGIES))
    mine = next(name for name, runs in STRATEGIES.items() if runs == strategy)
    assert result["NodeNames"] == [mine], result
    others = {name: runs for name, runs in STRATEGIES.items() if name != mine}
    assert refused(result).keys() == others.keys()
    for name, runs in others.items():
        assert refused(result)[name].startswith(f"node {name} runs the {runs} GPU strategy (label "), result


def test_a_pod_mixing_two_strategies_is_refused_naming_both(
    apiserver: ApiServerEmulator, cluster: dict[str, GpuNode], start_extender: StartExtender
) -> None:
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, gpu_pod("mixed", {keys.GPU_MEMORY: "1024", keys.GPU_NUMBER: "1"}))
    result = ext.client.filter(pod, list(STRATEGIES))
    assert result["NodeNames"] == []
    assert result["Error"] == (
        "pod default/mixed asks for resources of 2 GPU strategies: volcano.sh/gpu-memory (share); "
        "volcano.sh/gpu-number (number); a node runs one strategy, so no node can serve the pod"
    )
    assert "volcano.sh/gpu-number (number)" in ext.client.bind(pod, SHARE)


def labels(apiserver: ApiServerEmulator, name: str) -> dict[str, str]:
    node = apiserver.get("nodes", name) or {}
    return dict(node.get("metadata", {}).get("labels") or {})


def test_each_daemon_labels_its_node_with_its_strategy_and_keeps_the_label(
    apiserver: ApiServerEmulator, cluster: dict[str, GpuNode]
) -> None:
    """`kubectl get nodes -L volcano.sh/gpu-strategy` shows it, node affinity can select on it;
    a label someone removed or changed is put back, as the daemon's other node state is."""
    for name, strategy in STRATEGIES.items():
        assert labels(apiserver, name)[keys.GPU_STRATEGY_LABEL] == strategy
    apiserver.patch("nodes", SHARE, {"metadata": {"labels": {keys.GPU_STRATEGY_LABEL: None}}})
    apiserver.patch("nodes", NUMBER, {"metadata": {"labels": {keys.GPU_STRATEGY_LABEL: "vgpu"}}})
    eventually(
        lambda: labels(apiserver, SHARE).get(keys.GPU_STRATEGY_LABEL) == "share", cluster[SHARE].daemon
    )
    eventually(lambda: labels(apiserver, NUMBER)[keys.GPU_STRATEGY_LABEL] == "number", cluster[NUMBER].daemon)
    assert "node labels changed by someone else, restoring" in cluster[NUMBER].daemon.output()


def test_kubectl_shows_and_selects_the_strategy_label(
    apiserver: ApiServerEmulator, cluster: dict[str, GpuNode], workdir: Path
) -> None:
    binary = find_kubectl()
    if binary is None:
        pytest.skip(MISSING)
    kubectl = kubectl_for(binary, apiserver.write_kubeconfig(workdir / "kubeconfig"), workdir)
    rows = cells(kubectl("get", "nodes", "-L", keys.GPU_STRATEGY_LABEL).stdout)
    assert rows[0][-1] == "GPU-STRATEGY"
    assert {row[0]: row[-1] for row in rows[1:]} == STRATEGIES
    selected = kubectl("get", "nodes", "-l", f"{keys.GPU_STRATEGY_LABEL}=number", "-o", "name").stdout
    assert selected.split() == [f"node/{NUMBER}"]


def test_volcano_compat_places_as_volcano_does_without_the_label(
    apiserver: ApiServerEmulator, cluster: dict[str, GpuNode], start_extender: StartExtender
) -> None:
    """compat="volcano" reproduces Volcano, which reads no label: the share node is offered a
    gpu-number pod, and kubelet admits it there without any plugin's Allocate, so its container
    gets no GPU (what issue 19 saw)."""
    ext = start_extender(strategy="number", compat="volcano")
    pod = number_pod(apiserver, "whole")
    assert ext.client.filter(pod, [SHARE, NUMBER])["NodeNames"] == [SHARE, NUMBER]
    assert ext.client.bind(pod, SHARE) == ""
    bound = apiserver.get("pods", "whole", "default")
    assert bound is not None
    admission = cluster[SHARE].kubelet.admit(bound)
    assert admission.admitted
    assert admission.find("main", keys.GPU_NUMBER) is None  # no device plugin served it: no GPU


def test_nodes_without_the_label_are_read_from_what_they_publish(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """An older daemon or Volcano's own device plugins publish no label: a vGPU registration or
    resource is vgpu, gpu-memory (beside the patched gpu-number) share, gpu-number alone number."""
    apiserver.create("nodes", share_node("old-share"))
    apiserver.create("nodes", share_node("old-number", memory_resource=False))
    apiserver.create("nodes", vgpu_node("old-vgpu"))
    ext = start_extender(strategy="number")
    pod = number_pod(apiserver, "whole")
    result = ext.client.filter(pod, ["old-share", "old-number", "old-vgpu"])
    assert result["NodeNames"] == ["old-number"]
    assert refused(result) == {
        name: f"node {name} runs the {runs} GPU strategy (from what it publishes: no strategy label), "
        "which does not serve volcano.sh/gpu-number"
        for name, runs in (("old-share", "share"), ("old-vgpu", "vgpu"))
    }


def test_a_node_labelled_with_no_strategy_is_refused_naming_the_label(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    node = share_node("odd")
    node["metadata"]["labels"] = {keys.GPU_STRATEGY_LABEL: "mig"}
    apiserver.create("nodes", node)
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, gpu_pod("p", POD_OF["share"]))
    why = (
        "node odd: node label volcano.sh/gpu-strategy='mig' is not a GPU strategy "
        "(share, number, vgpu, whole)"
    )
    assert refused(ext.client.filter(pod, ["odd"])) == {"odd": why}


def test_a_bind_to_a_node_running_another_strategy_is_refused_as_the_filter_refuses_it(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """A node labelled for another strategy that still publishes this one's resource: its GPUs
    read as usable, so only the node's strategy stops the bind (kube-scheduler binds through the
    extender whatever chose the node) from booking a pod no plugin there serves."""
    node = share_node("relabelled")
    node["metadata"]["labels"] = {keys.GPU_STRATEGY_LABEL: "number"}
    apiserver.create("nodes", node)
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, gpu_pod("p", POD_OF["share"]))
    why = refused(ext.client.filter(pod, ["relabelled"]))["relabelled"]
    assert why.startswith("node relabelled runs the number GPU strategy (label volcano.sh/gpu-strategy)")
    assert ext.client.bind(pod, "relabelled") == f"cannot bind pod default/p to node relabelled: {why}"
    after = apiserver.get("pods", "p", "default")
    assert after is not None and not after["spec"].get("nodeName")
