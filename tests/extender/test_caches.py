"""The cluster-wide caches the extender runs on: every pod (pending ones too) and every node."""

from __future__ import annotations

from deviceplugin.kube.api import Kube
from deviceplugin.kube.podcache import NodeCache, PodCache
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import WAIT_S, gpu_pod, share_node
from tests.kube.objects import node_object


def _names(objects: list[dict[str, object]]) -> set[str]:
    return {str(obj["metadata"]["name"]) for obj in objects}  # type: ignore[index]


def test_cluster_pod_cache_holds_every_pod(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.create("pods", gpu_pod("on-a", node="a"))
    apiserver.create("pods", gpu_pod("pending"))
    cache = PodCache(kube, None)
    seen: list[tuple[str, str]] = []
    cache.add_listener(lambda kind, pod: seen.append((kind, pod["metadata"]["name"])))
    cache.start()
    try:
        assert cache.wait_synced(WAIT_S)
        assert _names(cache.pods()) == {"on-a", "pending"}
        apiserver.create("pods", gpu_pod("on-b", node="b"))
        apiserver.bind("default", "pending", "a")
        assert cache.wait_until(
            lambda c: ("MODIFIED", "pending") in seen and "on-b" in _names(c.pods()), WAIT_S
        )
        apiserver.delete("pods", "on-a", "default")
        assert cache.wait_until(lambda c: "on-a" not in _names(c.pods()), WAIT_S)
        assert ("DELETED", "on-a") in seen
    finally:
        cache.stop()
    assert apiserver.requests.count(path="fieldSelector") == 0  # no node scope


def test_node_cache_follows_status_and_annotations(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.create("nodes", share_node("gpu-1"))
    cache = NodeCache(kube)
    cache.start()
    try:
        assert cache.wait_synced(WAIT_S)
        assert _names(cache.nodes()) == {"gpu-1"}
        apiserver.create("nodes", node_object("cpu-1"))
        patch = {"metadata": {"annotations": {"volcano.sh/gpu-unhealthy-ids": "1"}}}
        apiserver.patch("nodes", "gpu-1", patch)

        def unhealthy(c: NodeCache) -> bool:
            node = c.get("gpu-1") or {}
            notes = node.get("metadata", {}).get("annotations", {})
            return bool(notes.get("volcano.sh/gpu-unhealthy-ids") == "1")

        assert cache.wait_until(lambda c: unhealthy(c) and c.get("cpu-1") is not None, WAIT_S)
        apiserver.delete("nodes", "cpu-1")
        assert cache.wait_until(lambda c: c.get("cpu-1") is None, WAIT_S)
    finally:
        cache.stop()
