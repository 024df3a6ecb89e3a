"""The extender places a multi-GPU pod on the best-linked cards the node's `volcano.sh/gpu-topology`
annotation names (docs/topology.md, "Choosing cards"), over HTTP: filter, prioritize and bind as
kube-scheduler calls them, the bind's annotations read back from the API server. A node without
the annotation, or with one that cannot be read (reported once on /metrics), binds as before."""

from __future__ import annotations

from deviceplugin.fit import decode_pod_devices
from deviceplugin.fit.topology import TOPOLOGY_KEY, Topology, parse_link
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Obj,
    Running,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    gpu_uuid,
    share_node,
    vgpu_node,
)
from tests.extender.test_isolation import rejected

NVLINKED = frozenset({2, 3, 6, 7})  # the one NVLink quad of the 8-GPU node; the rest is PCIe
FOUR_GPUS = {"volcano.sh/gpu-number": "4"}


def quad_topology() -> Topology:
    def link(a: int, b: int) -> str:
        if {a, b} <= NVLINKED:
            return "NV4"
        return "NODE" if a // 4 == b // 4 else "SYS"

    return Topology.build(range(8), [g // 4 for g in range(8)], lambda a, b: parse_link(link(a, b)))


def annotated(node: Obj, value: str) -> Obj:
    node["metadata"]["annotations"][TOPOLOGY_KEY] = value
    return node


def place(running: Running, apiserver: ApiServerEmulator, pod: Obj, node: str) -> Obj:
    """Filter, prioritize and bind as kube-scheduler does; the pod as the API server stores it."""
    created = create_pod(apiserver, pod)
    assert running.client.filter(created, [node])["NodeNames"] == [node]
    assert node in running.client.prioritize(created, [node])
    assert running.client.bind(created, node) == ""
    stored = apiserver.get("pods", created["metadata"]["name"], "default")
    assert stored is not None and stored["spec"]["nodeName"] == node
    notes: Obj = stored["metadata"]["annotations"]
    return notes


def test_a_four_gpu_pod_is_bound_to_the_nvlinked_quad(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create(
        "nodes", annotated(share_node("linked", gpus=8, memory_resource=False), quad_topology().encode())
    )
    apiserver.create("nodes", share_node("plain", gpus=8, memory_resource=False))
    running = start_extender(strategy="number", policy="binpack")
    assert place(running, apiserver, gpu_pod("job", FOUR_GPUS), "linked")["volcano.sh/gpu-index"] == "2,3,6,7"
    assert (
        place(running, apiserver, gpu_pod("other", FOUR_GPUS), "plain")["volcano.sh/gpu-index"] == "0,1,2,3"
    )
    # The quad is taken: the next pod gets the four left, whatever their links.
    assert (
        place(running, apiserver, gpu_pod("next", FOUR_GPUS), "linked")["volcano.sh/gpu-index"] == "0,1,4,5"
    )


def test_a_topology_published_later_is_read(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=8, memory_resource=False))
    running = start_extender(strategy="number")
    view = running.extender.inventory.view("n1")
    assert view is not None and view.topology is None
    apiserver.patch("nodes", "n1", {"metadata": {"annotations": {TOPOLOGY_KEY: quad_topology().encode()}}})
    eventually(lambda: view.topology == quad_topology())
    assert place(running, apiserver, gpu_pod("job", FOUR_GPUS), "n1")["volcano.sh/gpu-index"] == "2,3,6,7"


def test_a_malformed_topology_is_reported_and_the_node_schedules_as_without(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    broken = '{"gpus":[0,1],"numa":[0,0],"links":["NV99"]}'
    apiserver.create("nodes", annotated(share_node("n1", gpus=8, memory_resource=False), broken))
    running = start_extender(strategy="number")
    assert place(running, apiserver, gpu_pod("job", FOUR_GPUS), "n1")["volcano.sh/gpu-index"] == "0,1,2,3"
    assert rejected(running) == {"node": 1.0, "pod": 0.0}


def test_compat_volcano_reads_no_topology(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", annotated(share_node("n1", gpus=8, memory_resource=False), "not json"))
    running = start_extender(strategy="number", compat="volcano")
    view = running.extender.inventory.view("n1")
    assert view is not None and view.topology is None
    assert rejected(running) == {"node": 0.0, "pod": 0.0}  # Volcano does not read the annotation


def test_a_vgpu_pod_is_bound_to_an_nvlinked_pair(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Four idle cards, NVLinked in pairs (0,3) and (1,2): binpack visits cards used alike lowest
    index first, so 0 and 1 (across the host bridge) without the topology; with it 0's partner 3."""
    pairs = Topology.build(
        range(4), [0] * 4, lambda a, b: parse_link("NV4" if {a, b} in ({0, 3}, {1, 2}) else "PHB")
    )
    apiserver.create("nodes", annotated(vgpu_node("n1", gpus=4, memory=16000), pairs.encode()))
    running = start_extender(strategy="vgpu", policy="binpack")
    notes = place(running, apiserver, gpu_pod("job", {"volcano.sh/vgpu-number": "2"}), "n1")
    devices = decode_pod_devices(notes["volcano.sh/devices-to-allocate"])
    assert [device.uuid for device in devices[0]] == [gpu_uuid("n1", 0), gpu_uuid("n1", 3)]
