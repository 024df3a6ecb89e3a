"""Which strategy a node runs and which one a pod asks for (fit.strategy): the label first, what
the node publishes without it; a pod mixing two strategies' resources is an error naming both."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.fit import AnnotationError, RequestError, keys, node_strategy, pod_strategy
from tests.fit.builders import container, pod


def node(capacity: dict[str, str], *, label: str | None = None, notes: dict[str, str] | None = None) -> Any:
    metadata: dict[str, Any] = {"name": "n", "annotations": notes or {}}
    if label is not None:
        metadata["labels"] = {keys.GPU_STRATEGY_LABEL: label}
    return {"metadata": metadata, "status": {"capacity": capacity, "allocatable": dict(capacity)}}


SHARE_SHAPE = {keys.GPU_MEMORY: "21978", keys.GPU_NUMBER: "2"}


@pytest.mark.parametrize(
    ("published", "notes", "expected"),
    [
        (SHARE_SHAPE, None, "share"),  # gpu-memory beside the gpu-number card count it patches
        ({keys.GPU_NUMBER: "2"}, None, "number"),
        ({keys.VGPU_NUMBER: "20", keys.VGPU_MEMORY: "21978"}, None, "vgpu"),
        ({}, {keys.NODE_VGPU_REGISTER: "GPU-0,10,10989,NVIDIA-A100,true,hami-core:"}, "vgpu"),
        ({keys.NVIDIA_GPU: "8"}, None, "whole"),  # NVIDIA's device plugin
        ({**SHARE_SHAPE, keys.NVIDIA_GPU: "2"}, None, "share"),  # a sharing resource tells first
        ({"cpu": "8"}, None, None),
    ],
)
def test_a_node_without_the_label_is_read_from_what_it_publishes(
    published: dict[str, str], notes: dict[str, str] | None, expected: str | None
) -> None:
    assert node_strategy(node(published, notes=notes)) == expected


def test_the_label_wins() -> None:
    assert node_strategy(node(SHARE_SHAPE, label="number")) == "number"
    assert node_strategy(node({}, label="vgpu")) == "vgpu"


def test_a_label_that_is_no_strategy_is_an_error_naming_it() -> None:
    with pytest.raises(AnnotationError, match=r"node label volcano.sh/gpu-strategy='Share' is not a GPU"):
        node_strategy(node(SHARE_SHAPE, label="Share"))


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({keys.GPU_MEMORY: "1024"}, "share"),
        ({keys.GPU_NUMBER: "1"}, "number"),
        ({keys.VGPU_MEMORY: "1024"}, "vgpu"),
        ({keys.VGPU_NUMBER: "1", keys.VGPU_CORES: "50"}, "vgpu"),
        ({"nvidia.com/gpu": "1", "cpu": "1"}, "whole"),
        ({"cpu": "1"}, None),
    ],
)
def test_a_pods_strategy_is_the_one_its_resources_belong_to(
    limits: dict[str, str], expected: str | None
) -> None:
    assert pod_strategy(pod("p", [container("c", limits)])) == expected


def test_a_pod_mixing_two_strategies_across_containers_is_an_error_naming_them() -> None:
    mixed = pod("p", [container("a", {keys.GPU_MEMORY: "1024"}), container("b", {keys.VGPU_NUMBER: "1"})])
    with pytest.raises(RequestError) as caught:
        pod_strategy(mixed)
    assert str(caught.value) == (
        "pod default/p asks for resources of 2 GPU strategies: volcano.sh/gpu-memory (share); "
        "volcano.sh/vgpu-number (vgpu); a node runs one strategy, so no node can serve the pod"
    )


def test_init_containers_count() -> None:
    mixed = pod("p", [container("a", {keys.GPU_NUMBER: "1"})])
    mixed["spec"]["initContainers"] = [container("setup", {keys.GPU_MEMORY: "1024"})]
    with pytest.raises(
        RequestError, match=r"volcano.sh/gpu-memory \(share\); volcano.sh/gpu-number \(number\)"
    ):
        pod_strategy(mixed)
