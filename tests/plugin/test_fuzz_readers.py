"""Property tests: the daemon's pod readers answer any pod with a candidate (a problem naming
what is wrong, when it cannot be served as written), None, or a `FitInputError`; never another
exception, which would stop the pod cache's listeners (issue 13, F1). The issue's pods are
pinned as examples; hypothesis explores around them."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from deviceplugin.fit import keys
from deviceplugin.plugin.gpushare import read_gpushare_pod
from deviceplugin.plugin.vgpu import read_vgpu_pod
from tests.fuzz import FUZZ, annotated_pods, pods, value_or_fit_error

PODS = st.one_of(annotated_pods, pods)  # annotated first: the readers' work is reading annotations
POISON = "9" * 4301


def _pod(annotations: dict[str, Any], resource: str) -> dict[str, Any]:
    limits = {resource: "1"}
    return {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": annotations},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


@FUZZ
@given(PODS, st.sampled_from([keys.GPU_MEMORY, keys.GPU_NUMBER]))
@example(_pod({keys.PREDICATE_TIME: POISON}, keys.GPU_MEMORY), keys.GPU_MEMORY)
@example(_pod({keys.GPU_INDEX: POISON}, keys.GPU_NUMBER), keys.GPU_NUMBER)
@example(_pod({keys.GPU_INDEX: 7}, keys.GPU_MEMORY), keys.GPU_MEMORY)
def test_gpushare_reader(pod: Any, resource: str) -> None:
    value_or_fit_error(lambda: read_gpushare_pod(pod, resource))


@FUZZ
@given(PODS, st.sampled_from([keys.VGPU_NUMBER, keys.VGPU_MEMORY]))
@example(_pod({keys.VGPU_NODE: "node-a", keys.VGPU_TIME: POISON}, keys.VGPU_NUMBER), keys.VGPU_NUMBER)
@example(
    _pod({keys.VGPU_NODE: "node-a", keys.DEVICES_TO_ALLOCATE: f"GPU-a,NVIDIA,{POISON},0:"}, keys.VGPU_NUMBER),
    keys.VGPU_NUMBER,
)
@example(_pod({keys.VGPU_NODE: "node-a", keys.VGPU_TIME: None}, keys.VGPU_MEMORY), keys.VGPU_MEMORY)
def test_vgpu_reader(pod: Any, resource: str) -> None:
    value_or_fit_error(lambda: read_vgpu_pod(pod, "node-a", resource))
