"""Kubernetes objects of the wrong shape are reported, not half-read."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.fit import PodFormatError, fit_vgpu, parse_vgpu_requests, pod_gpu_memory
from tests.fit.builders import container, pod


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ({"metadata": [], "spec": {}}, r"object\.metadata must be an object, not list"),
        (
            {"metadata": {"name": "p"}, "spec": {"containers": {"name": "c"}}},
            r"pod default/p: spec\.containers",
        ),
        ({"metadata": {"name": "p"}, "spec": {"containers": ["c"]}}, r"must be a list of objects"),
        (
            {"metadata": {}, "spec": {"containers": [{"resources": []}]}},
            r"container\.resources must be an object",
        ),
        ({"metadata": {}, "spec": {"containers": [{"resources": {"limits": 5}}]}}, r"resources\.limits"),
        ({"metadata": {}, "spec": "x"}, r"pod\.spec must be an object"),
    ],
)
def test_malformed_pods_raise(broken: dict[str, Any], message: str) -> None:
    with pytest.raises(PodFormatError, match=message):
        parse_vgpu_requests(broken)
    if "containers" in str(broken):
        with pytest.raises(PodFormatError, match=message):
            pod_gpu_memory(broken)


def test_fit_reads_annotations_of_the_right_shape() -> None:
    broken = pod("p", [container("c", {"volcano.sh/vgpu-number": "1"})])
    broken["metadata"]["annotations"] = ["volcano.sh/vgpu-mode=mig"]
    with pytest.raises(PodFormatError, match=r"metadata\.annotations must be an object, not list"):
        fit_vgpu([], parse_vgpu_requests(broken), broken)


def test_absent_fields_read_as_empty() -> None:
    assert parse_vgpu_requests({}) == []
    assert pod_gpu_memory({"spec": {"containers": [{"name": "c"}]}}) == 0
    assert pod_gpu_memory(pod("p", [container("c", None, None)])) == 0
