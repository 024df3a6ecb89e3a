"""What the extender's caches keep of nodes and pods (`deviceplugin.extender.slim`): every decision
read from the kept object is the one read from the object as served, malformed objects are still
reported as malformed, and nothing kept is an object of the served one."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import pytest

from deviceplugin.extender.inventory import Inventory, _signature, other_strategy
from deviceplugin.extender.slim import Record, extender_node, extender_pod, record
from deviceplugin.fit import FitInputError, GpuState, holds_gpus
from deviceplugin.fit.families import family_of
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG
from deviceplugin.fit.topology import TOPOLOGY_KEY, Topology, parse_link
from tests.extender.conftest import gpu_pod, gpu_uuid, share_node, vgpu_node

Obj = dict[str, Any]
VGPU = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4000", "volcano.sh/vgpu-cores": "30"}
NOISE = {"kubectl.kubernetes.io/last-applied-configuration": "{}" * 100, "team": "ml"}


def _served(pod: Obj) -> Obj:
    """`pod` with what a real API server adds: labels, owner, managed fields, env, a status."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    meta.setdefault("uid", f"uid-{meta['name']}")
    meta["labels"] = {"app": "trainer", **meta.get("labels", {})}
    meta["annotations"] = {**NOISE, **meta.get("annotations", {})}
    meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    meta["resourceVersion"] = "42"
    for container in pod["spec"]["containers"]:
        container["env"] = [{"name": "A", "value": "1"}]
        container["command"] = ["python"]
    pod.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]
    return pod


def _pods() -> Iterator[Obj]:
    share = {"volcano.sh/gpu-memory": "4000"}
    yield gpu_pod("share", share, node="n1", annotations={"volcano.sh/gpu-index": "1"}, phase="Running")
    yield gpu_pod(
        "number", {"volcano.sh/gpu-number": "2"}, node="n1", annotations={"volcano.sh/gpu-index": "0,1"}
    )
    yield gpu_pod("pending", share)
    yield gpu_pod("done", share, node="n1", annotations={"volcano.sh/gpu-index": "0"}, phase="Succeeded")
    ids = f"{gpu_uuid('n1', 0)},NVIDIA,4000,30:"
    notes = {"volcano.sh/vgpu-ids-new": ids, "scheduling.k8s.io/group-name": "gang"}  # its group counts
    yield gpu_pod("vgpu", VGPU, node="n1", annotations=notes, phase="Running")
    filters = {
        "volcano.sh/vgpu-mode": "mps",
        "nvidia.com/use-gputype": "H100",
        "volcano.sh/vgpu-nouse-gpuuuid": gpu_uuid("n1", 1),
        "volcano.sh/vgpu-podgroup-policy": "spread",
        "scheduling.k8s.io/group-name": "gang",
    }
    yield gpu_pod("filters", VGPU, annotations=filters)
    requested = gpu_pod("requested", None)  # a vGPU memory given as a request, not a limit
    requested["spec"]["containers"][0]["resources"] = {
        "limits": {"volcano.sh/vgpu-number": "1"},
        "requests": {"volcano.sh/vgpu-memory": "2000"},
    }
    yield requested
    init = gpu_pod("init", VGPU)
    init["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": dict(VGPU)}}]
    yield init
    deleting = gpu_pod(
        "deleting", share, node="n1", annotations={"volcano.sh/gpu-index": "0"}, phase="Running"
    )
    deleting["metadata"]["deletionTimestamp"] = "2026-11-28T10:00:00Z"
    yield deleting
    yield gpu_pod("mixed", {**share, "volcano.sh/vgpu-number": "1"})
    yield gpu_pod("bad", {"volcano.sh/gpu-memory": "1.5"})


def _outcome(read: Callable[[], Any]) -> Any:
    """What a reader returns, or the message of the input error it raises."""
    try:
        return read()
    except FitInputError as err:
        return f"error: {err}"


def _cards() -> list[GpuState]:
    return [GpuState(index=i, uuid=gpu_uuid("n1", i), type="NVIDIA-H100", memory=16000) for i in range(2)]


def _booked(strategy: str, pod: Mapping[str, Any]) -> Any:
    """The cards' usage once `pod` is booked on them (labels aside: no exclusivity rule reads them
    in the extender, and the projection keeps only the GPU domains' labels)."""
    cards = _cards()
    family_of(strategy).book(cards, pod, None, DEFAULT_VGPU_CONFIG)
    return [
        (
            card.used_num,
            card.used_memory,
            card.used_cores,
            [(u.uid, u.name, u.memory, u.cores, u.group) for u in card.pods.values()],
        )
        for card in cards
    ]


@pytest.mark.parametrize("pod", list(_pods()), ids=lambda pod: pod["metadata"]["name"])
@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
def test_a_kept_pod_reads_as_the_served_one(strategy: str, pod: Obj) -> None:
    served = _served(pod)
    kept = extender_pod(served)
    family = family_of(strategy)
    for compat in (None, "volcano"):
        for read in (partial(family.request, compat=compat), partial(holds_gpus, compat=compat)):
            assert _outcome(partial(read, kept)) == _outcome(partial(read, served))
    assert _outcome(lambda: _booked(strategy, kept)) == _outcome(lambda: _booked(strategy, served))


def _nodes() -> Iterator[Obj]:
    yield share_node("share", unhealthy="1")
    yield share_node("number", memory_resource=False)
    yield vgpu_node("vgpu", unhealthy=(0,))
    labelled = vgpu_node("labelled")
    labelled["metadata"]["labels"] = {"volcano.sh/gpu-strategy": "share"}
    yield labelled
    factor = share_node("factor")
    factor["metadata"]["annotations"]["volcano.sh/gpu-memory-factor"] = "2"
    yield factor
    broken = vgpu_node("broken")
    broken["metadata"]["annotations"]["volcano.sh/node-vgpu-register"] = "GPU-1,x"
    yield broken


@pytest.mark.parametrize("node", list(_nodes()), ids=lambda node: node["metadata"]["name"])
@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
def test_a_kept_node_reads_as_the_served_one(strategy: str, node: Obj) -> None:
    served = copy.deepcopy(node)
    served["metadata"]["labels"] = {"kubernetes.io/hostname": "x", **served["metadata"].get("labels", {})}
    served["metadata"]["annotations"].update(NOISE)
    served["status"]["capacity"]["cpu"] = "224"
    served["status"]["images"] = [{"names": ["a"], "sizeBytes": 1}]
    kept = extender_node(served)
    family = family_of(strategy)
    assert _signature(kept) == _signature(served)
    assert other_strategy(kept, family) == other_strategy(served, family)
    views = []
    for obj in (kept, served):
        inventory = Inventory(strategy)  # type: ignore[arg-type]
        inventory.on_node("ADDED", obj)
        view = inventory.view(node["metadata"]["name"])
        assert view is not None
        views.append((view.gpus, view.config, view.error, view.other_strategy))
    assert views[0] == views[1]


def test_values_of_the_wrong_type_are_kept_so_the_pod_is_still_reported() -> None:
    pod = _served(gpu_pod("odd", {"volcano.sh/gpu-memory": "1000"}, node="n1"))
    pod["metadata"]["annotations"]["example.com/count"] = 3  # not a string: the readers refuse it
    pod["metadata"]["labels"]["example.com/flag"] = True
    kept = extender_pod(pod)
    assert kept["metadata"]["annotations"]["example.com/count"] == 3
    assert kept["metadata"]["labels"] == {"example.com/flag": True}
    with pytest.raises(FitInputError):
        family_of("share").book(_cards(), kept, None, DEFAULT_VGPU_CONFIG)
    odd_spec = _served(gpu_pod("spec", None))
    odd_spec["spec"]["containers"] = {"name": "not a list"}
    assert extender_pod(odd_spec)["spec"]["containers"] == {"name": "not a list"}


def test_only_what_the_decisions_read_is_kept() -> None:
    served = _served(
        gpu_pod("p", VGPU, node="n1", annotations={"volcano.sh/vgpu-ids-new": "x"}, phase="Running")
    )
    assert extender_pod(served) == {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "uid-p",
            "annotations": {"volcano.sh/vgpu-ids-new": "x"},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": VGPU}}]},
        "status": {"phase": "Running"},
    }


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_nothing_kept_is_an_object_of_the_served_one() -> None:
    """A served string kept alive would pin the allocator arena of the whole list it came in."""
    for made in [*map(_served, _pods()), *_nodes()]:
        served = json.loads(json.dumps(made))  # as the API client reads it: no string interned
        kept = (
            extender_node(served)
            if "status" in served and "capacity" in served["status"]
            else extender_pod(served)
        )
        served_ids = {id(s) for s in _strings(served) if len(s) > 1}  # 1-character strings are singletons
        assert not [s for s in _strings(kept) if id(s) in served_ids], served["metadata"]["name"]


def test_pods_of_one_template_share_their_containers() -> None:
    a, b = (extender_pod(_served(gpu_pod(name, VGPU))) for name in ("a", "b"))
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["metadata"]["name"] != b["metadata"]["name"]


def test_nodes_publishing_one_topology_share_its_text() -> None:
    """Nodes of one model publish the same ~280-byte topology: the extender keeps one string
    (bench/extender.py --topology: 8.24 KB per vGPU node with its pods, 8 KB the bar)."""
    text = Topology.build(range(8), [g // 4 for g in range(8)], lambda a, b: parse_link("NV12")).encode()

    def served(name: str) -> Obj:
        node = vgpu_node(name)
        node["metadata"].setdefault("annotations", {})[TOPOLOGY_KEY] = text
        read: Obj = json.loads(json.dumps(node))  # as the API client reads it: a string of its own each
        return read

    a, b = (extender_node(served(name)) for name in ("a", "b"))
    assert a["metadata"]["annotations"][TOPOLOGY_KEY] == text
    assert a["metadata"]["annotations"][TOPOLOGY_KEY] is b["metadata"]["annotations"][TOPOLOGY_KEY]


def test_a_record_reads_as_the_dict_it_was_made_from() -> None:
    source = {"name": "p", "uid": "u", "n": 1}
    made = record(source)
    assert isinstance(made, Record)
    assert made == source and dict(made) == source and len(made) == 3
    assert made["uid"] == "u" and made.get("n") == 1 and made.get("missing", 7) == 7
    assert "name" in made and "missing" not in made
    with pytest.raises(KeyError):
        made["missing"]
    assert {**made, "n": 2} == {"name": "p", "uid": "u", "n": 2}
    assert type(record({"name": "q", "uid": "v", "n": 2})) is type(made)  # one class per key set
