"""Property tests: the extender's node and pod readers answer any object with a value or a
`FitInputError`; never another exception, which would stop a cluster cache (issue 13, F1b, F2).
The issue's objects are pinned as examples; hypothesis explores around them."""

from __future__ import annotations

from functools import partial
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from deviceplugin.extender.inventory import memory_factor, node_name, pod_node, pod_uid
from deviceplugin.fit import VgpuConfig, keys
from deviceplugin.fit.families import family_of
from tests.fuzz import FUZZ, annotated_nodes, annotated_pods, nodes, pods, value_or_fit_error

POISON = "9" * 4301


def _node(annotations: dict[str, str]) -> dict[str, Any]:
    allocatable = {keys.VGPU_NUMBER: "10", keys.VGPU_CORES: "100", keys.VGPU_MEMORY: "1000"}
    capacity = {keys.GPU_MEMORY: "1000", keys.GPU_NUMBER: "1"}
    return {
        "metadata": {"name": "n", "annotations": annotations},
        "status": {"allocatable": allocatable, "capacity": capacity},
    }


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    limits = {keys.GPU_MEMORY: "100", keys.VGPU_NUMBER: "1"}
    return {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": annotations},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


_REGISTERED = {keys.NODE_VGPU_REGISTER: "GPU-a,10,1000,NVIDIA,true,hami-core:"}


@FUZZ
@given(
    st.one_of(annotated_nodes, nodes),
    st.lists(st.one_of(annotated_pods, pods), max_size=3),
    st.sampled_from(["share", "number", "vgpu"]),
    st.sampled_from([None, "volcano"]),
)
@example(_node({keys.NODE_VGPU_REGISTER: f"GPU-a,10,{'9' * 5000},NVIDIA,true,hami-core:"}), [], "vgpu", None)
@example(_node({keys.GPU_MEMORY_FACTOR: POISON}), [], "vgpu", None)
@example(_node({keys.GPU_MEMORY_FACTOR: "\u00b2"}), [], "share", None)
@example(_node({}), [_pod({keys.GPU_INDEX: POISON})], "share", None)
@example(_node(_REGISTERED), [_pod({keys.VGPU_IDS_NEW: f"GPU-a,NVIDIA,{POISON},0:"})], "vgpu", None)
@example(_node(_REGISTERED), [_pod({keys.VGPU_IDS_NEW: f"GPU-a[g-{POISON}],NVIDIA,1,0:"})], "vgpu", "volcano")
def test_node_and_pod_readers(node: Any, booked: list[Any], strategy: Any, compat: Any) -> None:
    family = family_of(strategy)
    assert isinstance(node_name(node), str)
    assert all(isinstance(pod_uid(pod), str) and isinstance(pod_node(pod), str) for pod in booked)

    def build() -> object:
        config = VgpuConfig(memory_factor=memory_factor(node))
        gpus = family.node_gpus(node, config, compat)
        for pod in booked:
            value_or_fit_error(partial(family.book, gpus, pod, compat, config))
        return gpus

    value_or_fit_error(build)
