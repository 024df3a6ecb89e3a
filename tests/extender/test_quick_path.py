"""The extender screens each node with its family's quick fit and runs the full fit only where the
quick one cannot decide or the pod does not fit. Over HTTP, on a cluster of nodes with random
usage, every filter and prioritize answer must be what the full fit gives on the extender's own
view of each node, also after binds have changed the nodes (their quick cards are rebuilt)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from deviceplugin.fit import FitResult
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Running,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    gpu_uuid,
    share_node,
    vgpu_node,
)

Obj = dict[str, Any]
NODES = 30
PENDING = 24
GPUS = 4
MEMORY = 16000


def _running(strategy: str, rng: random.Random, n: int, node: str) -> Obj:
    gpu, memory = rng.randrange(GPUS), rng.choice((2000, 4000, 8000, 12000))
    if strategy == "vgpu":
        cores = rng.choice((0, 20, 100))
        limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": str(memory)}
        notes = {"volcano.sh/vgpu-ids-new": f"{gpu_uuid(node, gpu)},NVIDIA,{memory},{cores}:"}
    elif strategy == "number":
        limits, notes = {"volcano.sh/gpu-number": "1"}, {"volcano.sh/gpu-index": str(gpu)}
    else:
        limits, notes = {"volcano.sh/gpu-memory": str(memory)}, {"volcano.sh/gpu-index": str(gpu)}
    return gpu_pod(f"run-{n}", limits, node=node, annotations=notes, phase="Running")


def _pending(strategy: str, rng: random.Random, n: int) -> Obj:
    if strategy == "vgpu":
        limits = {"volcano.sh/vgpu-number": str(rng.choice((1, 1, 2, 3)))}
        if rng.random() < 0.5:
            limits["volcano.sh/vgpu-memory"] = str(rng.choice((4000, 8000, 15000)))
        limits["volcano.sh/vgpu-cores"] = str(rng.choice((0, 30, 100)))
        # Some pods only the full fit decides: two GPU containers, a GPU type list.
        annotations = {"nvidia.com/use-gputype": "H100"} if rng.random() < 0.2 else {}
        pod = gpu_pod(f"new-{n}", limits, annotations=annotations)
        if rng.random() < 0.2:
            pod["spec"]["containers"].append(
                {"name": "side", "image": "cuda", "resources": {"limits": dict(limits)}}
            )
        return pod
    if strategy == "number":
        return gpu_pod(f"new-{n}", {"volcano.sh/gpu-number": str(rng.choice((1, 2, 3, 4)))})
    return gpu_pod(f"new-{n}", {"volcano.sh/gpu-memory": str(rng.choice((2000, 6000, 10000, 15000)))})


def _full_fits(ext: Running, pod: Obj, names: list[str]) -> dict[str, FitResult | str]:
    """The full fit of `pod` on each node as the extender sees it now (the reference), or why
    the node cannot take any pod of the strategy."""
    service = ext.extender.service
    request = service.request_of(pod)
    fits: dict[str, FitResult | str] = {}
    for name in names:
        view = ext.extender.inventory.view(name)
        why = service._unusable(name, view)
        if why or view is None:
            fits[name] = why
            continue
        with view.lock:
            fits[name] = service._fit(view, pod, request)
    return fits


def _check(ext: Running, pod: Obj, names: list[str]) -> list[str]:
    """Filter and prioritize `pod` over HTTP, compared with the full fit; the nodes that pass."""
    fits = _full_fits(ext, pod, names)
    results = {name: fit for name, fit in fits.items() if isinstance(fit, FitResult)}
    result = ext.client.filter(pod, names)
    assert result["Error"] == ""
    assert result["NodeNames"] == [name for name, fit in results.items() if fit.ok]
    assert result["FailedNodes"] == {name: fit.reason for name, fit in results.items() if not fit.ok}
    unusable = {name: why for name, why in fits.items() if isinstance(why, str)}
    assert result["FailedAndUnresolvableNodes"] == unusable
    assert len(unusable) == 2  # "ghost" is not in the cluster, "other" runs another strategy
    passed: list[str] = result["NodeNames"]
    score = ext.extender.service.host_score
    assert ext.client.prioritize(pod, passed) == {name: score(results[name]) for name in passed}
    # Without a filter first (another scheduler replica), prioritize scores the same.
    unseen = {**pod, "metadata": {**pod["metadata"], "uid": f"{pod['metadata']['uid']}-unseen"}}
    assert ext.client.prioritize(unseen, names) == {
        name: score(fit) if isinstance(fit, FitResult) else 0 for name, fit in fits.items()
    }
    return passed


@pytest.mark.parametrize(
    ("strategy", "policy"),
    [("share", "binpack"), ("number", "spread"), ("vgpu", "binpack"), ("vgpu", "spread")],
)
def test_filter_and_prioritize_answer_as_the_full_fit_before_and_after_binds(
    apiserver: ApiServerEmulator, start_extender: StartExtender, strategy: str, policy: str
) -> None:
    rng = random.Random(f"{strategy}-{policy}")
    names = [f"node-{n:02d}" for n in range(NODES)]
    for n, name in enumerate(names):
        sick = n % 7 == 0  # one unhealthy GPU
        if strategy == "vgpu":
            node = vgpu_node(name, GPUS, MEMORY, unhealthy=(1,) if sick else ())
        else:
            unhealthy = "1" if sick else None
            node = share_node(name, GPUS, MEMORY, unhealthy=unhealthy, memory_resource=strategy == "share")
        apiserver.create("nodes", node)
    # GPUs the family can read, on a node labelled for another strategy: unresolvable.
    other = share_node("other", GPUS, MEMORY) if strategy != "vgpu" else vgpu_node("other", GPUS, MEMORY)
    other["metadata"]["labels"] = {"volcano.sh/gpu-strategy": "vgpu" if strategy != "vgpu" else "share"}
    apiserver.create("nodes", other)
    running = 0
    for name in names:
        for _ in range(rng.randrange(5)):
            create_pod(apiserver, _running(strategy, rng, running, name))
            running += 1
    ext = start_extender(strategy=strategy, policy=policy)
    inventory = ext.extender.inventory
    eventually(lambda: sum(len(view.pods) for view in inventory.views.values()) == running)

    pods = [create_pod(apiserver, _pending(strategy, rng, n)) for n in range(PENDING)]
    asked = [*names, "other", "ghost"]
    outcomes = [len(_check(ext, pod, asked)) for pod in pods]
    assert any(0 < passed < NODES for passed in outcomes), outcomes  # some nodes pass, some fail

    bound = 0
    for pod in pods[: PENDING // 2]:
        fitting = _check(ext, pod, asked)
        if fitting:
            assert ext.client.bind(pod, rng.choice(fitting)) == ""
            bound += 1
    assert bound
    for pod in pods:
        _check(ext, pod, asked)  # the bound pods too: the cluster changed under every cached answer
