"""The HTTP surface: malformed bodies get a 400 that says what is wrong, health, wrong verbs."""

from __future__ import annotations

import pytest

from deviceplugin.extender import Extender, ExtenderConfig
from deviceplugin.kube.api import Kube
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import ExtenderClient, StartExtender, create_pod, memory_pod, share_node


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/filter", b"{not json", "not valid JSON"),
        ("/filter", b"", "body is empty"),
        ("/filter", b"[1, 2]", "must be a JSON object"),
        ("/filter", b'{"NodeNames": ["n1"]}', "ExtenderArgs.Pod"),
        ("/filter", b'{"Pod": {"metadata": {"name": "p"}}}', "needs Nodes (NodeList) or NodeNames"),
        ("/filter", b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "n1"}', "list of node names"),
        ("/filter", b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}]}}', "items[0]"),
        ("/prioritize", b'{"Pod": "p", "NodeNames": []}', "ExtenderArgs.Pod"),
        ("/bind", b'{"PodNamespace": "default", "Node": "n1"}', "PodName is required"),
        ("/bind", b'{"PodName": "p", "PodNamespace": "default"}', "Node is required"),
        ("/bind", b'{"PodName": 7, "Node": "n1"}', "PodName must be a string"),
    ],
)
def test_malformed_bodies_get_400_naming_the_problem(
    start_extender: StartExtender, path: str, body: bytes, expected: str
) -> None:
    ext = start_extender(strategy="share")
    reply = ext.client.request("POST", path, body)
    assert reply.status == 400
    assert expected in reply.body["Error"]


def test_field_names_match_case_insensitively_like_go(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    reply = ext.client.post("/filter", {"pod": pod, "nodenames": ["n1"]})
    assert reply.status == 200 and reply.body["NodeNames"] == ["n1"]


def test_healthz_unknown_paths_and_methods(start_extender: StartExtender) -> None:
    ext = start_extender(strategy="share")
    assert ext.client.request("GET", "/healthz").status == 200
    assert ext.client.request("GET", "/filter").status == 405
    assert ext.client.request("POST", "/preempt", b"{}").status == 404
    assert ext.client.request("GET", "/nothing").status == 404


def test_a_url_prefix_with_a_path_works(apiserver: ApiServerEmulator, start_extender: StartExtender) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    reply = ext.client.post("/gpu/filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert reply.status == 200 and reply.body["NodeNames"] == ["n1"]


def test_before_the_caches_sync_requests_get_an_error_and_readyz_503(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    apiserver.faults.error(503, path="/api/v1/nodes")
    extender = Extender(ExtenderConfig(), kube, address="127.0.0.1:0").start(sync_timeout_s=0)
    try:
        client = ExtenderClient(extender.url)
        assert client.request("GET", "/healthz").status == 200  # alive, not ready
        assert client.request("GET", "/readyz").status == 503
        pod = memory_pod("new", 1000)
        pod["metadata"]["uid"] = "u1"
        assert "not synced" in client.filter(pod, ["n1"])["Error"]
        apiserver.faults.clear()
        assert extender.nodes.wait_synced(15) and extender.pods.wait_synced(15)  # each in its own time
        assert client.request("GET", "/readyz").status == 200
    finally:
        extender.stop()
