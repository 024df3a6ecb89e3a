"""The extender's ClusterRole (deploy/extender.yaml) grants exactly the API calls the extender makes.

The extender runs a filter + prioritize + bind flow against the API-server emulator; every request
it sent is read back from the emulator's request log as an RBAC permission and compared with the
rules of the ClusterRole `volcano-gpu-extender`: each call must be allowed, and no rule may grant
anything the extender never does. The Binding it sent must pass deploy/admission-policy.yaml, evaluated
with the extender's identity.
"""

from __future__ import annotations

from kubesim.apiserver import ApiServerEmulator
from tests.deploy.admission import EXTENDER_USER, Request, admitted, recorded_writes
from tests.deploy.manifests import EXTENDER, Access, documents, find, granted, request_access
from tests.extender.conftest import StartExtender, create_pod, eventually, memory_pod, share_node


def test_cluster_role_grants_exactly_what_the_extender_calls(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    eventually(lambda: ext.extender.pods.get(pod["metadata"]["uid"]) is not None)
    assert ext.client.filter(pod, ["n1"])["NodeNames"] == ["n1"]
    ext.client.prioritize(pod, ["n1"])
    since = apiserver.resource_version
    assert ext.client.bind(pod, "n1") == ""
    apiserver.drop_watches()  # re-watching is part of normal life too
    eventually(lambda: apiserver.requests.count(watch=True) >= 4)

    used = {request_access(r.method, r.path, r.query) for r in apiserver.requests.records()}
    assert used == {
        Access("", "pods", "list"),
        Access("", "pods", "watch"),
        Access("", "nodes", "list"),
        Access("", "nodes", "watch"),
        Access("", "pods/binding", "create"),
    }, "the extender's API calls changed: update deploy/extender.yaml and this test"

    rights = granted(find(documents(EXTENDER), "ClusterRole", "volcano-gpu-extender"))
    assert used - rights == set(), f"calls the ClusterRole does not allow: {sorted(map(str, used - rights))}"
    assert rights - used == set(), f"the ClusterRole grants more than the extender uses: {rights - used}"
    # The Binding, as the bind left the pod: the node, and the annotations it added.
    (bound,) = [w for w in recorded_writes(apiserver, since, EXTENDER_USER, {}) if w.resource == "pods"]
    assert bound.old is not None and bound.obj["spec"]["nodeName"] == "n1"
    before = bound.old["metadata"].get("annotations") or {}
    added = {k: v for k, v in bound.obj["metadata"]["annotations"].items() if before.get(k) != v}
    assert added, "a GPU pod's bind writes its device annotations"
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": pod["metadata"]["name"],
            "namespace": pod["metadata"]["namespace"],
            "annotations": added,
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    allowed, denials = admitted(Request(EXTENDER_USER, "CREATE", "pods", body, None, "binding"))
    assert allowed, denials
