"""API-server emulator driven by the official `kubernetes` client over real HTTP (no mocks)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

from kubesim.apiserver import ApiServerEmulator
from tests.kube.waiting import WAIT_S
from tests.sim.apiserver_helpers import (
    CoreApi,
    Obj,
    core_api,
    http,
    node,
    pod,
    running_emulator,
    status_of,
    wait_until,
)

STALE = (
    'Operation cannot be fulfilled on pods "web": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    with running_emulator() as emulator:
        yield emulator


def _api(emulator: ApiServerEmulator, tmp_path: Path) -> Iterator[CoreApi]:
    api = core_api(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    yield api
    api.api_client.close()


@pytest.fixture
def api(emulator: ApiServerEmulator, tmp_path: Path) -> Iterator[CoreApi]:
    yield from _api(emulator, tmp_path)


def rv_of(obj: Any) -> int:
    return int(obj.metadata.resource_version)


def watch_events(list_call: Callable[..., Any], *args: Any, count: int, **kwargs: Any) -> list[Obj]:
    """The first `count` watch events (raw), or fewer if the 5 s guard timeout ends the stream."""
    stream = watch.Watch()
    events: list[Obj] = []
    for event in stream.stream(list_call, *args, timeout_seconds=5, **kwargs):
        events.append({"type": event["type"], "object": event["raw_object"]})
        if len(events) >= count:
            stream.stop()
    return events


def summary(events: list[Obj]) -> list[tuple[str, str]]:
    return [(event["type"], event["object"]["metadata"]["name"]) for event in events]


def merge(api: CoreApi, name: str, patch: Any, namespace: str = "default") -> Any:
    return api.patch_namespaced_pod(name, namespace, patch, _content_type="application/merge-patch+json")


# --------------------------------------------------------------------------- objects


def test_the_usual_namespaces_exist_from_the_start(api: CoreApi) -> None:
    names = [ns.metadata.name for ns in api.list_namespace().items]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    default = api.read_namespace("default")
    assert default.status.phase == "Active"
    assert default.metadata.labels == {"kubernetes.io/metadata.name": "default"}


def test_pod_lifecycle_through_the_client(api: CoreApi, emulator: ApiServerEmulator) -> None:
    created = api.create_namespaced_pod("default", pod("web", labels={"app": "web"}))
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    assert created.status.phase == "Pending" and created.status.qos_class == "BestEffort"
    assert created.spec.scheduler_name == "default-scheduler" and created.spec.restart_policy == "Always"
    assert created.spec.containers[0].image_pull_policy == "IfNotPresent"

    read = api.read_namespaced_pod("web", "default")
    assert read.metadata.uid == created.metadata.uid and rv_of(read) == rv_of(created)
    listed = api.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["web"]
    assert rv_of(listed) == emulator.resource_version

    read.metadata.labels["tier"] = "front"
    updated = api.replace_namespaced_pod("web", "default", read)
    assert updated.metadata.labels == {"app": "web", "tier": "front"} and rv_of(updated) > rv_of(read)
    patched = api.patch_namespaced_pod("web", "default", {"metadata": {"annotations": {"note": "x"}}})
    assert patched.metadata.annotations == {"note": "x"}

    deleted = api.delete_namespaced_pod("web", "default")
    assert deleted.metadata.name == "web"
    assert api.list_namespaced_pod("default").items == []
    assert emulator.get("pods", "web", "default") is None


def test_limits_default_the_requests_and_set_the_qos_class(api: CoreApi) -> None:
    limited = [{"name": "main", "image": "x:1", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]
    created = api.create_namespaced_pod("default", pod("guaranteed", containers=limited))
    assert created.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert created.status.qos_class == "Guaranteed"


def test_a_new_pod_gets_a_fresh_status(api: CoreApi) -> None:
    body = pod("web")
    body["status"] = {"phase": "Running", "podIP": "10.1.1.1"}
    created = api.create_namespaced_pod("default", body)
    assert created.status.phase == "Pending" and created.status.pod_ip is None


def test_nodes_namespaces_configmaps_and_events(api: CoreApi, emulator: ApiServerEmulator) -> None:
    created_node = api.create_node(node("gpu-1"))
    assert created_node.status.allocatable == created_node.status.capacity
    assert api.patch_node("gpu-1", {"metadata": {"labels": {"gpu": "yes"}}}).metadata.labels == {"gpu": "yes"}
    assert [n.metadata.name for n in api.list_node().items] == ["gpu-1"]
    # The client types these DELETE replies as plain objects: a success Status for nodes ...
    assert api.delete_node("gpu-1")["status"] == "Success"

    api.create_namespace({"metadata": {"name": "team-a"}})
    api.create_namespaced_config_map("team-a", {"metadata": {"name": "cfg"}, "data": {"policy": "binpack"}})
    assert api.read_namespaced_config_map("cfg", "team-a").data == {"policy": "binpack"}
    replaced = api.replace_namespaced_config_map(
        "cfg", "team-a", {"metadata": {"name": "cfg"}, "data": {"policy": "spread"}}
    )
    assert replaced.data == {"policy": "spread"}

    event = {
        "metadata": {"name": "web.1"},
        "involvedObject": {"kind": "Pod", "namespace": "team-a", "name": "web", "uid": "u-1"},
        "reason": "AllocateFailed",
        "message": "no GPU",
        "type": "Warning",
        "count": 1,
    }
    api.create_namespaced_event("team-a", event)
    assert [e.reason for e in api.list_namespaced_event("team-a").items] == ["AllocateFailed"]

    deleted = api.delete_namespace("team-a")  # ... and the terminating object for namespaces
    assert deleted["status"] == {"phase": "Terminating"}
    assert emulator.get("namespaces", "team-a") is None
    assert emulator.list("configmaps", "team-a") == [] and emulator.list("events", "team-a") == []


def test_times_are_stored_as_the_server_encodes_them(api: CoreApi, emulator: ApiServerEmulator) -> None:
    # The client sends its datetimes with an offset; Go decodes any RFC 3339 time and writes UTC,
    # whole seconds (metav1.Time) or microseconds (metav1.MicroTime).
    event = {
        "metadata": {"name": "gpu-1.1"},
        "involvedObject": {"kind": "Node", "name": "gpu-1"},
        "reason": "GpuUnhealthy",
        "firstTimestamp": "2026-03-01T12:00:00.75+02:00",
        "lastTimestamp": "2026-03-01t10:30:00z",
        "eventTime": "2026-03-01T12:00:00.5+02:00",
    }
    api.create_namespaced_event("default", event)
    stored = emulator.get("events", "gpu-1.1", "default")
    assert stored is not None
    assert (stored["firstTimestamp"], stored["lastTimestamp"], stored["eventTime"]) == (
        "2026-03-01T10:00:00Z",
        "2026-03-01T10:30:00Z",
        "2026-03-01T10:00:00.500000Z",
    )
    labels = {"lastTimestamp": "not a time"}  # user maps are not times, whatever their keys
    api.create_namespaced_config_map(
        "default", {"metadata": {"name": "cfg", "labels": labels}, "data": labels}
    )
    assert api.read_namespaced_config_map("cfg", "default").data == labels


def test_a_time_that_is_not_rfc_3339_is_a_bad_request(emulator: ApiServerEmulator) -> None:
    node_body = node("gpu-1")
    node_body["status"]["conditions"][0]["lastHeartbeatTime"] = "yesterday"
    code, body, _ = http(emulator, "POST", "/api/v1/nodes", node_body)
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"] == (
        'Node in version "v1" cannot be handled as a Node: '
        'status.conditions[0].lastHeartbeatTime: parsing time "yesterday": not an RFC 3339 time'
    )
    assert emulator.get("nodes", "gpu-1") is None


def test_generate_name_makes_a_unique_name(api: CoreApi) -> None:
    body = {"metadata": {"generateName": "job-"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}
    names = {api.create_namespaced_pod("default", body).metadata.name for _ in range(3)}
    assert len(names) == 3 and all(name.startswith("job-") and len(name) == 9 for name in names)


def test_creating_in_a_missing_namespace_is_not_found(api: CoreApi) -> None:
    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_pod("nowhere", pod("web", namespace="nowhere"))
    status = status_of(raised.value)
    assert (status["code"], status["reason"]) == (404, "NotFound")
    assert status["message"] == 'namespaces "nowhere" not found'
    assert status["details"] == {"name": "nowhere", "kind": "namespaces"}


def test_reading_a_missing_pod_is_not_found(api: CoreApi) -> None:
    with pytest.raises(client.ApiException) as raised:
        api.read_namespaced_pod("ghost", "default")
    status = status_of(raised.value)
    assert status["reason"] == "NotFound" and status["message"] == 'pods "ghost" not found'


def test_creating_twice_is_already_exists(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_pod("default", pod("web"))
    status = status_of(raised.value)
    assert (status["code"], status["reason"], status["message"]) == (
        409,
        "AlreadyExists",
        'pods "web" already exists',
    )


@pytest.mark.parametrize(
    ("metadata", "field", "message"),
    [
        ({}, "metadata.name", "Required value: name or generateName is required"),
        ({"name": "Bad_Name"}, "metadata.name", 'Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain'),
    ],
)
def test_a_bad_name_is_invalid(api: CoreApi, metadata: Obj, field: str, message: str) -> None:
    body = {"metadata": metadata, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}
    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_pod("default", body)
    status = status_of(raised.value)
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["message"].startswith(f'Pod "{metadata.get("name", "")}" is invalid: {field}: {message}')
    assert status["details"]["causes"][0]["field"] == field


def test_a_pod_spec_change_other_than_images_is_forbidden(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    with pytest.raises(client.ApiException) as raised:
        merge(api, "web", {"spec": {"nodeName": "gpu-1"}})
    status = status_of(raised.value)
    assert (
        status["reason"] == "Invalid"
        and "spec: Forbidden: pod updates may not change fields" in status["message"]
    )
    assert (
        merge(api, "web", {"spec": {"containers": [{"name": "main", "image": "x:2"}]}})
        .spec.containers[0]
        .image
        == "x:2"
    )


# --------------------------------------------------------------------------- resourceVersion and conflicts


def test_every_write_moves_the_one_resource_version(api: CoreApi, emulator: ApiServerEmulator) -> None:
    versions = [emulator.resource_version]
    versions.append(rv_of(api.create_namespaced_pod("default", pod("web"))))
    versions.append(rv_of(api.create_node(node("gpu-1"))))
    versions.append(rv_of(merge(api, "web", {"metadata": {"labels": {"a": "1"}}})))
    versions.append(rv_of(api.patch_node_status("gpu-1", {"status": {"phase": "Running"}})))
    assert versions == sorted(set(versions)) and versions[-1] == emulator.resource_version
    # A patch that changes nothing writes nothing, like the real server.
    assert rv_of(merge(api, "web", {"metadata": {"labels": {"a": "1"}}})) == versions[3]
    assert emulator.resource_version == versions[-1]


def test_update_with_a_stale_resource_version_conflicts(api: CoreApi) -> None:
    stale = api.create_namespaced_pod("default", pod("web"))
    merge(api, "web", {"metadata": {"labels": {"moved": "on"}}})
    stale.metadata.labels = {"mine": "old"}
    with pytest.raises(client.ApiException) as raised:
        api.replace_namespaced_pod("web", "default", stale)
    status = status_of(raised.value)
    assert (status["code"], status["reason"], status["message"]) == (409, "Conflict", STALE)
    assert status["details"] == {"name": "web", "kind": "pods"}


def test_update_without_a_resource_version_is_unconditional(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    body = pod("web", labels={"forced": "yes"})
    assert api.replace_namespaced_pod("web", "default", body).metadata.labels == {"forced": "yes"}


def test_a_resource_version_in_a_patch_is_a_precondition(api: CoreApi) -> None:
    created = api.create_namespaced_pod("default", pod("web"))
    current = merge(api, "web", {"metadata": {"annotations": {"a": "1"}}})
    stale_patch = {
        "metadata": {"resourceVersion": created.metadata.resource_version, "annotations": {"b": "2"}}
    }
    with pytest.raises(client.ApiException) as raised:
        merge(api, "web", stale_patch)
    assert status_of(raised.value)["message"] == STALE
    fresh_patch = {
        "metadata": {"resourceVersion": current.metadata.resource_version, "annotations": {"b": "2"}}
    }
    assert merge(api, "web", fresh_patch).metadata.annotations == {"a": "1", "b": "2"}


def test_delete_preconditions(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
    with pytest.raises(client.ApiException) as raised:
        api.delete_namespaced_pod("web", "default", body=options)
    status = status_of(raised.value)
    assert (
        status["reason"] == "Conflict"
        and "Precondition failed: UID in precondition: not-the-uid" in status["message"]
    )


# --------------------------------------------------------------------------- patches


def test_merge_strategic_and_json_patches_of_labels_and_annotations(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web", labels={"app": "web", "tier": "x"}))
    merged = merge(
        api, "web", {"metadata": {"labels": {"tier": None, "new": "1"}, "annotations": {"a": "1"}}}
    )
    assert merged.metadata.labels == {"app": "web", "new": "1"} and merged.metadata.annotations == {"a": "1"}
    strategic = api.patch_namespaced_pod(
        "web", "default", {"metadata": {"annotations": {"a": None, "b": "2"}}}
    )
    assert strategic.metadata.annotations == {"b": "2"}
    ops = [
        {"op": "add", "path": "/metadata/labels/gpu~1index", "value": "0"},
        {"op": "remove", "path": "/metadata/labels/new"},
        {"op": "replace", "path": "/metadata/annotations/b", "value": "3"},
        {"op": "test", "path": "/metadata/name", "value": "web"},
    ]
    patched = api.patch_namespaced_pod("web", "default", ops, _content_type="application/json-patch+json")
    assert patched.metadata.labels == {"app": "web", "gpu/index": "0"} and patched.metadata.annotations == {
        "b": "3"
    }
    strategic = api.patch_namespaced_pod("web", "default", {"metadata": {"annotations": {"b": None}}})
    assert strategic.metadata.annotations is None  # an emptied map is omitted, as the real server does


def test_a_failing_json_patch_is_unprocessable(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    ops = [{"op": "test", "path": "/metadata/name", "value": "other"}]
    with pytest.raises(client.ApiException) as raised:
        api.patch_namespaced_pod("web", "default", ops, _content_type="application/json-patch+json")
    assert raised.value.status == 422


def test_strategic_patch_merges_containers_by_name_merge_patch_replaces(api: CoreApi) -> None:
    two = [
        {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
        {"name": "b", "image": "b:1"},
    ]
    api.create_namespaced_pod("default", pod("web", containers=two))
    strategic = api.patch_namespaced_pod(
        "web", "default", {"spec": {"containers": [{"name": "b", "image": "b:2"}]}}
    )
    assert [(c.name, c.image) for c in strategic.spec.containers] == [("a", "a:1"), ("b", "b:2")]
    with pytest.raises(client.ApiException) as raised:  # a merge patch replaces the list: `a` would go
        merge(api, "web", {"spec": {"containers": [{"name": "b", "image": "b:3"}]}})
    assert "spec: Forbidden" in status_of(raised.value)["message"]


def test_strategic_patch_merges_conditions_by_type(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    ready = {"type": "Ready", "status": "False"}
    api.patch_namespaced_pod_status("web", "default", {"status": {"conditions": [ready]}})
    scheduled = {"type": "PodScheduled", "status": "True"}
    both = api.patch_namespaced_pod_status("web", "default", {"status": {"conditions": [scheduled]}})
    assert [(c.type, c.status) for c in both.status.conditions] == [
        ("Ready", "False"),
        ("PodScheduled", "True"),
    ]
    replaced = api.patch_namespaced_pod_status(
        "web", "default", {"status": {"conditions": [ready]}}, _content_type="application/merge-patch+json"
    )
    assert [c.type for c in replaced.status.conditions] == ["Ready"]
    deleted = api.patch_namespaced_pod_status(
        "web", "default", {"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}
    )
    assert deleted.status.conditions is None or deleted.status.conditions == []


def test_strategic_patch_unions_finalizers_and_honours_delete_from_list(api: CoreApi) -> None:
    api.create_namespaced_config_map("default", {"metadata": {"name": "cfg", "finalizers": ["a/x"]}})
    added = api.patch_namespaced_config_map("cfg", "default", {"metadata": {"finalizers": ["b/y"]}})
    assert added.metadata.finalizers == ["a/x", "b/y"]
    patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x", "b/y"]}}
    assert api.patch_namespaced_config_map("cfg", "default", patch).metadata.finalizers is None


def test_server_side_apply_creates_then_merges(api: CoreApi) -> None:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}}
    apply = {"_content_type": "application/apply-patch+yaml", "field_manager": "test"}
    assert api.patch_namespaced_config_map("cfg", "default", manifest, **apply).data == {"a": "1"}
    manifest["data"] = {"b": "2"}
    assert api.patch_namespaced_config_map("cfg", "default", manifest, **apply).data == {"a": "1", "b": "2"}
    with pytest.raises(client.ApiException) as raised:
        api.patch_namespaced_config_map(
            "cfg", "default", manifest, _content_type="application/apply-patch+yaml"
        )
    assert status_of(raised.value)["message"].endswith(
        "fieldManager: Required value: is required for apply patch"
    )


def test_patching_a_missing_object_is_not_found(api: CoreApi) -> None:
    with pytest.raises(client.ApiException) as raised:
        merge(api, "ghost", {"metadata": {"labels": {"a": "b"}}})
    assert status_of(raised.value)["reason"] == "NotFound"


# --------------------------------------------------------------------------- status subresource and binding


def test_status_and_main_resource_change_separately(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("web"))
    body = api.read_namespaced_pod("web", "default")
    body.status.phase = "Running"
    body.metadata.labels = {"via": "main"}
    main = api.replace_namespaced_pod("web", "default", body)
    assert main.status.phase == "Pending" and main.metadata.labels == {"via": "main"}

    body = api.read_namespaced_pod("web", "default")
    body.status.phase = "Running"
    body.spec.active_deadline_seconds = 99
    status = api.replace_namespaced_pod_status("web", "default", body)
    assert status.status.phase == "Running" and status.spec.active_deadline_seconds is None
    patched = api.patch_namespaced_pod_status("web", "default", {"status": {"podIP": "10.1.0.5"}})
    assert patched.status.pod_ip == "10.1.0.5" and patched.status.phase == "Running"

    api.create_node(node("gpu-1"))
    node_status = api.patch_node_status("gpu-1", {"status": {"capacity": {"volcano.sh/gpu-memory": "81920"}}})
    assert node_status.status.capacity["volcano.sh/gpu-memory"] == "81920"
    ignored = api.patch_node("gpu-1", {"status": {"capacity": {"volcano.sh/gpu-memory": "1"}}})
    assert ignored.status.capacity["volcano.sh/gpu-memory"] == "81920"


def _binding(
    name: str, node_name: str, annotations: dict[str, str], uid: str | None = None
) -> client.V1Binding:
    return client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations, uid=uid),
        target=client.V1ObjectReference(kind="Node", api_version="v1", name=node_name),
    )


def test_binding_assigns_node_and_annotations_in_one_event(api: CoreApi) -> None:
    before = api.create_namespaced_pod("default", pod("web", labels={"app": "web"}))
    merge(api, "web", {"metadata": {"annotations": {"keep": "me"}}})
    start = api.read_namespaced_pod("web", "default").metadata.resource_version
    annotations = {"volcano.sh/gpu-index": "0", "volcano.sh/predicate-time": "1700000000000000000"}
    reply = api.create_namespaced_binding(
        "default", _binding("web", "gpu-1", annotations), _preload_content=False
    )
    # The real server answers a Status, which the client cannot read as a V1Binding; see the next test.
    assert reply.status == 201
    assert json.loads(reply.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    bound = api.read_namespaced_pod("web", "default")
    assert bound.spec.node_name == "gpu-1"
    assert bound.metadata.annotations == {"keep": "me", **annotations}
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    events = watch_events(api.list_namespaced_pod, "default", resource_version=start, count=1)
    assert summary(events) == [("MODIFIED", "web")]
    assert rv_of(bound) == rv_of(before) + 2

    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_pod_binding(
            "web", "default", _binding("web", "gpu-2", {}), _preload_content=False
        )
    status = status_of(raised.value)
    assert (status["code"], status["reason"]) == (409, "Conflict")
    assert status["message"] == (
        'Operation cannot be fulfilled on pods/binding "web": pod web is already assigned to node "gpu-1"'
    )


def test_binding_reply_is_a_status_like_the_real_servers(api: CoreApi) -> None:
    """The client's generated code expects a Binding back and fails to read the real server's Status,
    so callers pass `_preload_content=False`; the binding itself is done."""
    api.create_namespaced_pod("default", pod("web"))
    with pytest.raises(ValueError, match="target"):
        api.create_namespaced_pod_binding("web", "default", _binding("web", "gpu-1", {}))
    assert api.read_namespaced_pod("web", "default").spec.node_name == "gpu-1"


def test_a_bindings_uid_is_a_precondition(api: CoreApi) -> None:
    """kube-scheduler's Binding carries the pod's UID: a pod deleted and made again under its name
    is not bound by the Binding meant for the one before (Conflict), the right UID binds."""
    old = api.create_namespaced_pod("default", pod("web"))
    api.delete_namespaced_pod("web", "default")
    new = api.create_namespaced_pod("default", pod("web"))
    stale = _binding("web", "gpu-1", {"volcano.sh/gpu-index": "0"}, uid=old.metadata.uid)
    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_pod_binding("web", "default", stale, _preload_content=False)
    status = status_of(raised.value)
    assert (status["code"], status["reason"]) == (409, "Conflict")
    why = f"UID in precondition: {old.metadata.uid}, UID in object meta: {new.metadata.uid}"
    assert f"Precondition failed: {why}" in status["message"]
    assert api.read_namespaced_pod("web", "default").spec.node_name is None
    current = _binding("web", "gpu-1", {}, uid=new.metadata.uid)
    api.create_namespaced_pod_binding("web", "default", current, _preload_content=False)
    assert api.read_namespaced_pod("web", "default").spec.node_name == "gpu-1"


def test_binding_a_missing_pod_is_not_found(api: CoreApi) -> None:
    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_binding("default", _binding("ghost", "gpu-1", {}), _preload_content=False)
    assert status_of(raised.value)["message"] == 'pods "ghost" not found'


# --------------------------------------------------------------------------- selectors and lists


@pytest.fixture
def pods(api: CoreApi) -> None:
    api.create_namespace({"metadata": {"name": "other"}})
    specs = [
        ("a", "default", {"app": "web", "tier": "1"}, "gpu-1", "Running", "default-scheduler"),
        ("b", "default", {"app": "web"}, "gpu-2", "Pending", "volcano"),
        ("c", "default", {"app": "db", "tier": "2"}, "", "Pending", "volcano"),
        ("d", "other", {"legacy": "yes"}, "gpu-1", "Succeeded", "default-scheduler"),
    ]
    for name, namespace, labels, node_name, phase, scheduler in specs:
        api.create_namespaced_pod(namespace, pod(name, namespace, labels=labels, schedulerName=scheduler))
        if node_name:
            api.create_namespaced_binding(namespace, _binding(name, node_name, {}), _preload_content=False)
        api.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})


@pytest.mark.usefixtures("pods")
@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("spec.nodeName=gpu-1", ["a", "d"]),
        ("spec.nodeName==gpu-2", ["b"]),
        ("spec.nodeName=", ["c"]),
        ("spec.nodeName!=gpu-1", ["b", "c"]),
        ("status.phase=Pending", ["b", "c"]),
        ("status.phase!=Pending,spec.nodeName=gpu-1", ["a", "d"]),
        ("metadata.name=b", ["b"]),
        ("metadata.namespace=other", ["d"]),
        ("spec.schedulerName=volcano", ["b", "c"]),
    ],
)
def test_pod_field_selectors(api: CoreApi, selector: str, names: list[str]) -> None:
    listed = api.list_pod_for_all_namespaces(field_selector=selector)
    assert [p.metadata.name for p in listed.items] == names


@pytest.mark.usefixtures("pods")
@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("app in (db, web),tier", ["a", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("tier>1", ["c"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selectors(api: CoreApi, selector: str, names: list[str]) -> None:
    listed = api.list_pod_for_all_namespaces(label_selector=selector)
    assert [p.metadata.name for p in listed.items] == names


def test_field_selectors_of_other_kinds(api: CoreApi) -> None:
    api.create_node(node("gpu-1"))
    api.create_node(node("gpu-2"))
    assert [n.metadata.name for n in api.list_node(field_selector="metadata.name=gpu-2").items] == ["gpu-2"]
    assert len(api.list_node(field_selector="spec.unschedulable=false").items) == 2
    assert [n.metadata.name for n in api.list_namespace(field_selector="metadata.name=default").items] == [
        "default"
    ]
    api.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}})
    found = api.list_config_map_for_all_namespaces(
        field_selector="metadata.namespace=default,metadata.name=cfg"
    )
    assert [c.metadata.name for c in found.items] == ["cfg"]
    for name, reason, kind in (
        ("e1", "Scheduled", "Pod"),
        ("e2", "AllocateFailed", "Pod"),
        ("e3", "Ready", "Node"),
    ):
        api.create_namespaced_event(
            "default",
            {
                "metadata": {"name": name},
                "involvedObject": {"kind": kind, "name": "web", "namespace": "default", "uid": f"uid-{name}"},
                "reason": reason,
                "type": "Warning" if reason == "AllocateFailed" else "Normal",
            },
        )
    for selector, names in (
        ("involvedObject.kind=Pod", ["e1", "e2"]),
        ("involvedObject.name=web,involvedObject.namespace=default", ["e1", "e2", "e3"]),
        ("involvedObject.uid=uid-e3", ["e3"]),
        ("reason=AllocateFailed", ["e2"]),
        ("type=Normal", ["e1", "e3"]),
    ):
        assert [
            e.metadata.name for e in api.list_namespaced_event("default", field_selector=selector).items
        ] == names


@pytest.mark.parametrize(
    ("call", "selector"),
    [
        ("list_pod_for_all_namespaces", "spec.gpu=0"),
        ("list_node", "metadata.namespace=x"),
        ("list_namespace", "spec.x=1"),
    ],
)
def test_an_unsupported_field_is_a_bad_request(api: CoreApi, call: str, selector: str) -> None:
    with pytest.raises(client.ApiException) as raised:
        getattr(api, call)(field_selector=selector)
    status = status_of(raised.value)
    assert (status["code"], status["reason"]) == (400, "BadRequest")
    assert status["message"] == f"field label not supported: {selector.split('=', maxsplit=1)[0]}"


def test_a_malformed_label_selector_is_a_bad_request(api: CoreApi) -> None:
    with pytest.raises(client.ApiException) as raised:
        api.list_namespaced_pod("default", label_selector="app in web")
    assert status_of(raised.value)["reason"] == "BadRequest"


def test_lists_page_with_limit_and_continue(api: CoreApi) -> None:
    for index in range(5):
        api.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{index}"}})
    first = api.list_namespaced_config_map("default", limit=2)
    assert [c.metadata.name for c in first.items] == ["cm-0", "cm-1"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    rest = api.list_namespaced_config_map("default", limit=10, _continue=first.metadata._continue)
    assert [c.metadata.name for c in rest.items] == ["cm-2", "cm-3", "cm-4"]
    assert (
        rest.metadata._continue is None and rest.metadata.resource_version == first.metadata.resource_version
    )


def test_delete_collection_by_label(api: CoreApi, emulator: ApiServerEmulator) -> None:
    for name, app in (("a", "web"), ("b", "web"), ("c", "db")):
        api.create_namespaced_pod("default", pod(name, labels={"app": app}))
    api.delete_collection_namespaced_pod("default", label_selector="app=web")
    assert [p["metadata"]["name"] for p in emulator.list("pods", "default")] == ["c"]


# --------------------------------------------------------------------------- watches


def test_watch_from_zero_lists_then_follows(api: CoreApi, emulator: ApiServerEmulator) -> None:
    api.create_namespaced_pod("default", pod("a"))

    def later() -> None:  # once the watch is open: `b` comes as an event, not in the first list
        assert wait_until(lambda: emulator.requests.count(watch=True) == 1)
        api.create_namespaced_pod("default", pod("b"))

    writer = threading.Thread(target=later)
    writer.start()
    events = watch_events(api.list_namespaced_pod, "default", resource_version="0", count=2)
    writer.join()
    assert summary(events) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_resumes_exactly_the_missed_events_in_order(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("a"))
    start = api.list_namespaced_pod("default").metadata.resource_version
    api.create_namespaced_pod("default", pod("b"))
    api.create_node(node("gpu-1"))  # another kind: not in this watch
    merge(api, "a", {"metadata": {"labels": {"x": "1"}}})
    api.delete_namespaced_pod("b", "default")
    events = watch_events(api.list_namespaced_pod, "default", resource_version=start, count=3)
    assert summary(events) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    versions = [int(event["object"]["metadata"]["resourceVersion"]) for event in events]
    assert versions == sorted(versions) and versions[0] > int(start)


def test_a_watch_from_a_compacted_version_is_expired(api: CoreApi, emulator: ApiServerEmulator) -> None:
    start = api.create_namespaced_pod("default", pod("a")).metadata.resource_version
    merge(api, "a", {"metadata": {"labels": {"x": "1"}}})
    emulator.compact()
    with pytest.raises(client.ApiException) as raised:
        watch_events(api.list_namespaced_pod, "default", resource_version=start, count=1)
    assert raised.value.status == 410
    assert raised.value.reason == f"Expired: too old resource version: {start} ({emulator.resource_version})"
    # The current version still works.
    current = str(emulator.resource_version)
    merge(api, "a", {"metadata": {"labels": {"x": "2"}}})
    assert summary(watch_events(api.list_namespaced_pod, "default", resource_version=current, count=1)) == [
        ("MODIFIED", "a")
    ]


def test_the_watch_history_window_is_bounded(tmp_path: Path) -> None:
    with running_emulator(watch_history=3) as emulator:
        for api in _api(emulator, tmp_path):
            start = api.create_namespaced_pod("default", pod("a")).metadata.resource_version
            for value in range(4):
                merge(api, "a", {"metadata": {"labels": {"x": str(value)}}})
            with pytest.raises(client.ApiException) as raised:
                watch_events(api.list_namespaced_pod, "default", resource_version=start, count=1)
            assert raised.value.status == 410
            recent = str(emulator.resource_version - 2)
            assert (
                len(watch_events(api.list_namespaced_pod, "default", resource_version=recent, count=2)) == 2
            )


def test_bookmarks_arrive_when_allowed(tmp_path: Path) -> None:
    with running_emulator(bookmark_interval_s=0.05) as emulator:
        for api in _api(emulator, tmp_path):
            api.create_namespaced_pod("default", pod("a"))
            start = str(emulator.resource_version)
            events = watch_events(
                api.list_namespaced_pod,
                "default",
                resource_version=start,
                allow_watch_bookmarks=True,
                count=2,
            )
            assert [event["type"] for event in events] == ["BOOKMARK", "BOOKMARK"]
            assert events[0]["object"] == {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": start},
            }


def test_objects_leaving_and_entering_a_selection(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("a", labels={"gpu": "yes"}))
    api.create_namespaced_pod("default", pod("b"))
    start = api.list_namespaced_pod("default").metadata.resource_version
    merge(api, "a", {"metadata": {"labels": {"gpu": None}}})
    merge(api, "b", {"metadata": {"labels": {"gpu": "yes"}}})
    merge(api, "b", {"metadata": {"annotations": {"note": "1"}}})
    events = watch_events(
        api.list_namespaced_pod, "default", resource_version=start, label_selector="gpu=yes", count=3
    )
    assert summary(events) == [("DELETED", "a"), ("ADDED", "b"), ("MODIFIED", "b")]
    # The watcher last saw `a` with its label; DELETED shows that state at the version it left.
    assert events[0]["object"]["metadata"]["labels"] == {"gpu": "yes"}
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) == int(start) + 1


def test_a_field_selected_watch_follows_binding(api: CoreApi) -> None:
    api.create_namespaced_pod("default", pod("a"))
    start = api.list_namespaced_pod("default").metadata.resource_version
    api.create_namespaced_binding("default", _binding("a", "gpu-1", {}), _preload_content=False)
    events = watch_events(
        api.list_pod_for_all_namespaces, field_selector="spec.nodeName=gpu-1", resource_version=start, count=1
    )
    assert summary(events) == [("ADDED", "a")]


def test_a_watch_ends_at_its_timeout(api: CoreApi) -> None:
    # A clean end (no error); the client's own read timeout only guards against never ending.
    events = watch.Watch().stream(api.list_namespaced_pod, "default", timeout_seconds=1, _request_timeout=30)
    assert list(events) == []


# --------------------------------------------------------------------------- graceful deletion and finalizers


def test_graceful_pod_deletion(tmp_path: Path) -> None:
    with running_emulator(graceful_pod_deletion=True) as emulator:
        for api in _api(emulator, tmp_path):
            api.create_namespaced_pod("default", pod("bound"))
            api.create_namespaced_binding("default", _binding("bound", "gpu-1", {}), _preload_content=False)
            start = api.read_namespaced_pod("bound", "default").metadata.resource_version
            terminating = api.delete_namespaced_pod("bound", "default")
            assert terminating.metadata.deletion_timestamp is not None
            assert terminating.metadata.deletion_grace_period_seconds == 30
            assert api.read_namespaced_pod("bound", "default").metadata.deletion_timestamp is not None
            emulator.finish_deletion("default", "bound")
            events = watch_events(api.list_namespaced_pod, "default", resource_version=start, count=2)
            assert summary(events) == [("MODIFIED", "bound"), ("DELETED", "bound")]

            api.create_namespaced_pod("default", pod("forced"))
            api.create_namespaced_binding("default", _binding("forced", "gpu-1", {}), _preload_content=False)
            api.delete_namespaced_pod("forced", "default")
            api.delete_namespaced_pod("forced", "default", grace_period_seconds=0)
            assert emulator.get("pods", "forced", "default") is None

            api.create_namespaced_pod("default", pod("unscheduled"))
            api.delete_namespaced_pod("unscheduled", "default")  # never started: gone at once
            assert emulator.get("pods", "unscheduled", "default") is None


def test_finalizers_hold_deletion_until_removed(api: CoreApi, emulator: ApiServerEmulator) -> None:
    api.create_namespaced_config_map(
        "default", {"metadata": {"name": "cfg", "finalizers": ["example.com/hold"]}}
    )
    held = api.delete_namespaced_config_map("cfg", "default")
    assert held["kind"] == "ConfigMap"  # the object itself comes back while it waits
    assert (emulator.get("configmaps", "cfg", "default") or {})["metadata"]["deletionTimestamp"]
    api.patch_namespaced_config_map("cfg", "default", {"metadata": {"finalizers": None}})
    assert emulator.get("configmaps", "cfg", "default") is None


def test_the_initial_namespaces_cannot_be_deleted(api: CoreApi) -> None:
    with pytest.raises(client.ApiException) as raised:
        api.delete_namespace("default")
    assert status_of(raised.value)["reason"] == "Forbidden"


# --------------------------------------------------------------------------- raw HTTP


def test_unknown_paths_and_methods_answer_a_status(emulator: ApiServerEmulator) -> None:
    code, body, _ = http(emulator, "GET", "/api/v1/widgets")
    assert code == 404 and body["reason"] == "NotFound" and body["kind"] == "Status"
    code, body, _ = http(emulator, "PUT", "/api/v1/namespaces/default/pods")
    assert code == 405 and body["reason"] == "MethodNotAllowed"
    code, body, _ = http(
        emulator, "PATCH", "/api/v1/nodes/x", {"a": 1}, headers={"Content-Type": "application/xml"}
    )
    assert code == 415 and body["reason"] == "UnsupportedMediaType"


def test_discovery_lists_the_served_resources(emulator: ApiServerEmulator) -> None:
    code, body, _ = http(emulator, "GET", "/api/v1")
    resources = {entry["name"]: entry for entry in body["resources"]}
    assert code == 200 and body["kind"] == "APIResourceList"
    assert {
        "pods",
        "pods/status",
        "pods/binding",
        "nodes",
        "nodes/status",
        "namespaces",
        "events",
        "configmaps",
    } <= set(resources)
    assert resources["pods"]["shortNames"] == ["po"] and resources["pods/binding"]["verbs"] == ["create"]
    assert http(emulator, "GET", "/version")[1]["minor"] == "32"


def test_a_table_is_served_when_asked_for(emulator: ApiServerEmulator) -> None:
    emulator.create("pods", pod("web"))
    accept = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    code, table, _ = http(emulator, "GET", "/api/v1/namespaces/default/pods", headers=accept)
    assert code == 200 and table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
        "Nominated Node",
        "Readiness Gates",
    ]
    assert table["rows"][0]["cells"][:4] == ["web", "0/1", "Pending", "0"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


# --------------------------------------------------------------------------- faults and the request log


def test_latency_is_added_to_matching_requests(api: CoreApi, emulator: ApiServerEmulator) -> None:
    fault = emulator.faults.latency(0.3, method="GET", path="/pods", times=1)
    api.create_namespaced_pod("default", pod("web"))  # not matching
    api.list_namespaced_pod("default")
    api.list_namespaced_pod("default")
    assert fault.hits == 1  # the first list only: the rule is spent
    held_back = emulator.requests.records()[1]  # the emulator's own record of that list
    assert (held_back.method, held_back.duration_s >= 0.3) == ("GET", True)


def test_an_injected_error_surfaces_as_api_exception(api: CoreApi, emulator: ApiServerEmulator) -> None:
    fault = emulator.faults.error(503, path="/api/v1/nodes")
    for _ in range(2):
        with pytest.raises(client.ApiException) as raised:
            api.list_node()
        assert status_of(raised.value)["reason"] == "ServiceUnavailable"
    assert fault.hits == 2
    emulator.faults.clear(fault)
    assert api.list_node().items == []

    emulator.faults.error(429, retry_after_s=2, method="POST", times=1)
    with pytest.raises(client.ApiException) as raised:
        api.create_namespaced_pod("default", pod("web"))
    assert raised.value.status == 429 and (raised.value.headers or {})["Retry-After"] == "2"
    assert status_of(raised.value)["details"] == {"retryAfterSeconds": 2}
    api.create_namespaced_pod("default", pod("web"))  # the fault was for one request only

    emulator.faults.error(409, message="injected conflict", times=1)
    with pytest.raises(client.ApiException) as raised:
        api.read_namespaced_pod("web", "default")
    assert status_of(raised.value)["reason"] == "Conflict"


def test_a_hung_request_times_the_client_out(api: CoreApi, emulator: ApiServerEmulator) -> None:
    fault = emulator.faults.hang(method="POST", path="/configmaps")
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        api.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}}, _request_timeout=0.3)
    assert fault.hits == 1
    assert emulator.get("configmaps", "cfg", "default") is None
    emulator.faults.clear(fault)
    assert wait_until(
        lambda: emulator.get("configmaps", "cfg", "default") is not None
    )  # released: served late
    assert api.read_namespaced_config_map("cfg", "default").metadata.name == "cfg"


def test_dropping_watches_breaks_the_stream(api: CoreApi, emulator: ApiServerEmulator) -> None:
    outcome: list[BaseException | str] = []

    def follow() -> None:
        try:
            for _ in watch.Watch().stream(api.list_namespaced_pod, "default", timeout_seconds=5):
                pass
            outcome.append("ended cleanly")
        except Exception as error:  # the test asserts which one
            outcome.append(error)

    follower = threading.Thread(target=follow)
    follower.start()
    assert wait_until(lambda: emulator.requests.count(watch=True) == 1)
    assert emulator.drop_watches() == 1
    follower.join()  # its own 5 s timeout would end it cleanly: the drop must end it first
    assert len(outcome) == 1 and isinstance(outcome[0], urllib3.exceptions.ProtocolError)


def test_refusing_watches_for_a_while(api: CoreApi, emulator: ApiServerEmulator) -> None:
    emulator.faults.error(503, path="watch=true")
    with pytest.raises(client.ApiException) as raised:
        watch_events(api.list_namespaced_pod, "default", count=1)
    assert raised.value.status == 503
    assert api.list_namespaced_pod("default").items == []  # plain lists still work


def test_the_request_log_counts_calls(api: CoreApi, emulator: ApiServerEmulator) -> None:
    api.create_namespaced_pod("default", pod("web"))
    api.read_namespaced_pod("web", "default")
    mark = time.time()
    emulator.create("pods", pod("direct"))  # direct access is not an API call
    assert emulator.requests.count(since=mark) == 0
    assert emulator.requests.count(method="POST", path="/pods") == 1
    assert emulator.requests.count(method="GET", path="/namespaces/default/pods/web") == 1
    record = emulator.requests.records()[-1]
    assert (record.method, record.path, record.code, record.watch) == (
        "GET",
        "/api/v1/namespaces/default/pods/web",
        200,
        False,
    )
    assert record.duration_s >= 0 and record.started_at <= mark
    emulator.requests.clear()
    assert emulator.requests.count() == 0


# --------------------------------------------------------------------------- lifecycle


def test_stop_ends_open_watches_promptly(tmp_path: Path) -> None:
    ended = threading.Event()
    emulator = ApiServerEmulator().start()
    api = next(_api(emulator, tmp_path))

    def follow() -> None:
        try:
            for _ in watch.Watch().stream(api.list_namespaced_pod, "default", timeout_seconds=3600):
                pass
        except urllib3.exceptions.HTTPError:
            pass  # the connection going away mid-stream is also an ending
        ended.set()

    follower = threading.Thread(target=follow)
    follower.start()
    assert wait_until(lambda: emulator.requests.count(watch=True) == 1)
    emulator.stop()
    emulator.stop()  # idempotent
    assert ended.wait(WAIT_S)  # long before the watch's own hour
    follower.join()
    api.api_client.close()


def test_hung_requests_are_released_by_stop() -> None:
    outcome: list[BaseException] = []
    with running_emulator() as emulator:
        fault = emulator.faults.hang()

        def call() -> None:
            try:
                http(emulator, "GET", "/api/v1/nodes")
            except Exception as error:  # any failure will do: the point is that the call returns
                outcome.append(error)

        caller = threading.Thread(target=call)
        caller.start()
        assert wait_until(lambda: fault.hits == 1)
    caller.join(5)
    assert not caller.is_alive() and outcome


def test_run_apiserver_serves_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    script = "import sys; from pathlib import Path; from kubesim.apiserver import run_apiserver; "
    script += f"sys.exit(run_apiserver(0, Path({str(kubeconfig)!r})))"
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:") and process.stdout.readline().strip() == str(kubeconfig)
    api = core_api(kubeconfig)
    assert api.list_namespace().items[0].metadata.name == "default"
    api.api_client.close()
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 0
