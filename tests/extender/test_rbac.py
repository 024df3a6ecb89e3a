"""The extender's ClusterRole (deploy/extender.yaml) grants exactly the API calls the extender makes.

The extender runs a filter + prioritize + bind flow against the API-server emulator; every request
it sent is read back from the emulator's request log as (verb, resource) and compared with the
rules of the ClusterRole `volcano-gpu-extender`: each call must be allowed, and no rule may grant
anything the extender never does.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

import pytest
import yaml

from deviceplugin.sim.apiserver import ApiServerEmulator, RequestRecord
from tests.extender.conftest import StartExtender, create_pod, eventually, memory_pod, share_node

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "extender.yaml"
ROLE = "volcano-gpu-extender"

Permission = tuple[str, str, str]  # (api group, resource[/subresource], verb)


def permission(record: RequestRecord) -> Permission:
    """The RBAC (group, resource, verb) a core/v1 request needs, as the API server authorizes it."""
    parts = [part for part in record.path.split("/") if part]
    assert parts[:2] == ["api", "v1"], f"not a core/v1 request: {record.target}"
    rest = parts[2:]
    if rest and rest[0] == "watch":
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0]
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    query = parse_qs(record.query)
    if record.method == "GET":
        verb = "watch" if record.watch or query.get("watch") == ["true"] else ("get" if named else "list")
    else:
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }[record.method]
    return "", resource, verb


def granted(role: dict[str, object]) -> set[Permission]:
    rules = role.get("rules")
    assert isinstance(rules, list), "the ClusterRole has no rules list"
    result: set[Permission] = set()
    for rule in rules:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    result.add((group, resource, verb))
    return result


def cluster_role() -> dict[str, object]:
    documents = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if isinstance(doc, dict)]
    roles = [
        doc
        for doc in documents
        if doc.get("kind") == "ClusterRole" and (doc.get("metadata") or {}).get("name") == ROLE
    ]
    assert len(roles) == 1, f"{MANIFEST} must define one ClusterRole named {ROLE}"
    return roles[0]


@pytest.mark.skipif(not MANIFEST.exists(), reason=f"{MANIFEST} is not written yet")
def test_cluster_role_grants_exactly_what_the_extender_calls(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    eventually(lambda: ext.extender.pods.get(pod["metadata"]["uid"]) is not None)
    assert ext.client.filter(pod, ["n1"])["NodeNames"] == ["n1"]
    ext.client.prioritize(pod, ["n1"])
    assert ext.client.bind(pod, "n1") == ""
    apiserver.drop_watches()  # re-watching is part of normal life too
    eventually(lambda: apiserver.requests.count(watch=True) >= 4)

    used = {permission(record) for record in apiserver.requests.records()}
    expected = {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods/binding", "create"),
    }
    assert used == expected, "the extender's API calls changed: update deploy/extender.yaml and this test"

    rights = granted(cluster_role())
    assert used - rights == set(), f"calls the ClusterRole does not allow: {sorted(used - rights)}"
    assert rights - used == set(), (
        f"the ClusterRole grants more than the extender uses: {sorted(rights - used)}"
    )
