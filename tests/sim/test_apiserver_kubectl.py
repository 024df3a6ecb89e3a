"""API-server emulator driven by the real `kubectl` binary through a kubeconfig (no mocks)."""

from __future__ import annotations

import json
import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.kube.api import Kube, load_client
from deviceplugin.kube.events import Involved, event_body
from kubesim.apiserver import ApiServerEmulator
from tests.sim.apiserver_helpers import Obj, node, pod, running_emulator, wait_until
from tests.sim.kubectl import RUN_TIMEOUT_S, Kubectl, cells, kubectl_for

LINE_TIMEOUT_S = 10


def _kubectl(binary: str, emulator: ApiServerEmulator, tmp_path: Path) -> Kubectl:
    return kubectl_for(binary, emulator.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    with running_emulator() as emulator:
        yield emulator


@pytest.fixture
def kubectl(kubectl_binary: str, emulator: ApiServerEmulator, tmp_path: Path) -> Kubectl:
    return _kubectl(kubectl_binary, emulator, tmp_path)


def deleted(what: str, output: str) -> bool:
    """kubectl's line for a deletion; recent releases add `from <namespace> namespace`."""
    return re.fullmatch(re.escape(what) + r" deleted( from \S+ namespace)?", output.strip()) is not None


def running_pod(
    emulator: ApiServerEmulator, name: str, node_name: str, labels: dict[str, str] | None = None
) -> None:
    """A pod as a scheduler and kubelet would leave it: bound, running, ready."""
    emulator.create("pods", pod(name, labels=labels or {}))
    emulator.bind("default", name, node_name)
    status = {
        "phase": "Running",
        "podIP": "10.1.0.9",
        "podIPs": [{"ip": "10.1.0.9"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": "main", "ready": True, "restartCount": 2, "state": {"running": {}}, "image": "pause"}
        ],
    }
    emulator.patch("pods", name, {"status": status}, "default", subresource="status")


# --------------------------------------------------------------------------- reading


def test_get_pods_prints_the_servers_table(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    running_pod(emulator, "web", "gpu-1")
    emulator.create("pods", pod("pending"))
    rows = cells(kubectl("get", "pods").stdout)
    assert rows[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [row[:4] for row in rows[1:]] == [
        ["pending", "0/1", "Pending", "0"],
        ["web", "1/1", "Running", "2"],
    ]

    wide = cells(kubectl("get", "pods", "-o", "wide").stdout)
    assert wide[0][5:] == ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
    assert wide[2][5:] == ["10.1.0.9", "gpu-1", "<none>", "<none>"]


def test_get_pods_across_namespaces_adds_the_namespace_column(
    kubectl: Kubectl, emulator: ApiServerEmulator
) -> None:
    emulator.create("namespaces", {"metadata": {"name": "team-a"}})
    emulator.create("pods", pod("web", namespace="team-a"))
    rows = cells(kubectl("get", "pods", "-A").stdout)
    assert rows[0][:2] == ["NAMESPACE", "NAME"] and rows[1][:2] == ["team-a", "web"]


def test_get_pods_as_json(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    emulator.create("pods", pod("a", labels={"app": "web"}))
    emulator.create("pods", pod("b"))
    listed = json.loads(kubectl("get", "pods", "-o", "json").stdout)
    assert listed["kind"] == "List"
    assert [(item["kind"], item["metadata"]["name"]) for item in listed["items"]] == [
        ("Pod", "a"),
        ("Pod", "b"),
    ]
    one = json.loads(kubectl("get", "pod", "a", "-o", "json").stdout)
    assert one["metadata"]["labels"] == {"app": "web"} and one["status"]["phase"] == "Pending"


def test_get_nodes_wide(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    emulator.create("nodes", node("gpu-1", labels={"node-role.kubernetes.io/worker": ""}))
    emulator.create("nodes", node("gpu-2", ready=False))
    rows = cells(kubectl("get", "nodes", "-o", "wide").stdout)
    assert rows[0][:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert rows[0][5:] == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
    assert rows[1][:3] == ["gpu-1", "Ready", "worker"]
    assert rows[1][4:] == ["v1.32.0", "10.0.0.7", "<none>", "Ubuntu 22.04", "6.1.0", "containerd://1.7.0"]
    assert rows[2][:3] == ["gpu-2", "NotReady", "<none>"]


def test_get_namespaces_configmaps_and_events(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    assert cells(kubectl("get", "ns").stdout)[1][:2] == ["default", "Active"]
    emulator.create("configmaps", {"metadata": {"name": "cfg"}, "data": {"a": "1", "b": "2"}})
    rows = cells(kubectl("get", "cm").stdout)
    assert rows[0] == ["NAME", "DATA", "AGE"] and rows[1][:2] == ["cfg", "2"] and rows[1][2].endswith("s")
    event = {
        "metadata": {"name": "web.1"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "AllocateFailed",
        "message": "no GPU fits",
        "type": "Warning",
    }
    emulator.create("events", event)
    rows = cells(kubectl("get", "events").stdout)
    assert rows[0] == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert rows[1][1:] == ["Warning", "AllocateFailed", "pod/web", "no GPU fits"]


def test_events_the_daemon_posts_show_when_they_were_seen(
    kubectl: Kubectl, emulator: ApiServerEmulator, tmp_path: Path
) -> None:
    kube = Kube(load_client(emulator.write_kubeconfig(tmp_path / "client-kubeconfig")))
    about = Involved.node("gpu-1")
    kube.create_event("default", event_body(about, "Warning", "GpuUnhealthy", "GPU 0 lost", "gpu-1"))
    rows = cells(kubectl("get", "events").stdout)
    assert rows[1][1:] == ["Warning", "GpuUnhealthy", "node/gpu-1", "GPU 0 lost"]
    assert re.fullmatch(r"\d+s", rows[1][0]), rows[1][0]  # not <unknown>
    (listed,) = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed["lastTimestamp"])


def test_api_resources_and_a_lease_in_its_group(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    rows = cells(kubectl("api-resources").stdout)
    assert rows[0] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert ["leases", "coordination.k8s.io/v1", "true", "Lease"] in rows
    lease: Obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpu-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "gpu-1", "leaseDurationSeconds": 40},
    }
    path = kubectl.manifest("lease.yaml", lease)
    assert kubectl("apply", "-f", path).stdout.strip() == "lease.coordination.k8s.io/gpu-1 created"
    assert cells(kubectl("get", "leases", "-A").stdout)[1][:3] == ["kube-node-lease", "gpu-1", "gpu-1"]
    stored = emulator.get("leases", "gpu-1", "kube-node-lease")
    assert stored is not None and stored["apiVersion"] == "coordination.k8s.io/v1"
    wrong = kubectl("get", "--raw", "/api/v1/namespaces/kube-node-lease/leases", check=False)
    assert wrong.returncode == 1 and "NotFound" in wrong.stderr  # leases live in their group only


def test_selectors(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    running_pod(emulator, "a", "gpu-1", labels={"app": "web"})
    running_pod(emulator, "b", "gpu-2", labels={"app": "db"})
    assert kubectl("get", "pods", "--field-selector", "spec.nodeName=gpu-2", "-o", "name").stdout.split() == [
        "pod/b"
    ]
    assert kubectl("get", "pods", "-l", "app in (web)", "-o", "name").stdout.split() == ["pod/a"]
    bad = kubectl("get", "pods", "--field-selector", "spec.gpu=1", check=False)
    assert bad.returncode == 1 and "field label not supported: spec.gpu" in bad.stderr


def test_a_missing_object_is_reported_not_found(kubectl: Kubectl) -> None:
    done = kubectl("get", "pod", "ghost", check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == 'Error from server (NotFound): pods "ghost" not found'


def test_typed_commands_sending_protobuf_get_a_clear_refusal(kubectl: Kubectl) -> None:
    done = kubectl("create", "namespace", "demo", check=False)
    assert done.returncode == 1
    assert "UnsupportedMediaType" in done.stderr and "use kubectl create -f / apply -f" in done.stderr


def test_get_watch_streams_rows(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    emulator.create("pods", pod("web"))
    process = kubectl.start("get", "pods", "--watch")
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        header = lines.get(timeout=LINE_TIMEOUT_S).split()
        first = lines.get(timeout=LINE_TIMEOUT_S).split()
        assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and first[:3] == [
            "web",
            "0/1",
            "Pending",
        ]
        assert wait_until(lambda: emulator.requests.count(watch=True) == 1)
        emulator.create("pods", pod("api"))
        assert lines.get(timeout=LINE_TIMEOUT_S).split()[:3] == ["api", "0/1", "Pending"]
    finally:
        process.kill()
        process.wait()
        reader.join(5)


# --------------------------------------------------------------------------- writing


def test_create_from_a_file(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    path = kubectl.manifest("pod.yaml", pod("web", labels={"app": "web"}))
    assert kubectl("create", "-f", path).stdout.strip() == "pod/web created"
    stored = emulator.get("pods", "web", "default")
    assert stored is not None and stored["metadata"]["labels"] == {"app": "web"}
    again = kubectl("create", "-f", path, check=False)
    assert again.returncode == 1 and 'pods "web" already exists' in again.stderr


def test_create_and_replace_raw_send_their_bodies_chunked(
    kubectl: Kubectl, emulator: ApiServerEmulator
) -> None:
    manifest: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}}
    collection = "/api/v1/namespaces/default/configmaps"
    created = json.loads(
        kubectl("create", "--raw", collection, "-f", kubectl.manifest("cfg.json", manifest)).stdout
    )
    assert (created["metadata"]["name"], created["data"]) == ("cfg", {"a": "1"})
    manifest["data"] = {"a": "2"}
    path = kubectl.manifest("cfg.json", manifest)
    replaced = json.loads(kubectl("replace", "--raw", f"{collection}/cfg", "-f", path).stdout)
    assert replaced["data"] == {"a": "2"}
    stored = emulator.get("configmaps", "cfg", "default")
    assert stored is not None and stored["data"] == {"a": "2"}


def test_annotate_and_label(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    emulator.create("pods", pod("web"))
    kubectl("annotate", "pod", "web", "volcano.sh/gpu-index=0")
    kubectl("label", "pod", "web", "app=web", "tier=front")
    conflict = kubectl("annotate", "pod", "web", "volcano.sh/gpu-index=1", check=False)
    assert conflict.returncode == 1 and "already has a value" in conflict.stderr
    kubectl("annotate", "pod", "web", "volcano.sh/gpu-index=1", "--overwrite")
    kubectl("label", "pod", "web", "tier-")
    stored = emulator.get("pods", "web", "default")
    assert stored is not None
    assert stored["metadata"]["annotations"] == {"volcano.sh/gpu-index": "1"}
    assert stored["metadata"]["labels"] == {"app": "web"}


@pytest.mark.parametrize(
    ("patch_type", "patch", "annotations"),
    [
        ("merge", {"metadata": {"annotations": {"a": None, "c": "3"}}}, {"b": "2", "c": "3"}),
        ("strategic", {"metadata": {"annotations": {"b": None}}}, {"a": "1"}),
        ("json", [{"op": "replace", "path": "/metadata/annotations/a", "value": "9"}], {"a": "9", "b": "2"}),
    ],
)
def test_patch(
    kubectl: Kubectl, emulator: ApiServerEmulator, patch_type: str, patch: object, annotations: dict[str, str]
) -> None:
    body = pod("web")
    body["metadata"]["annotations"] = {"a": "1", "b": "2"}
    emulator.create("pods", body)
    done = kubectl("patch", "pod", "web", "--type", patch_type, "-p", json.dumps(patch))
    assert done.stdout.strip() == "pod/web patched"
    stored = emulator.get("pods", "web", "default")
    assert stored is not None and stored["metadata"]["annotations"] == annotations


def test_apply_creates_then_updates_three_way(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    manifest: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"a": "1", "b": "2"},
    }
    path = kubectl.manifest("cfg.yaml", manifest)
    assert kubectl("apply", "-f", path).stdout.strip() == "configmap/cfg created"
    manifest["data"] = {"a": "1", "c": "3"}
    path = kubectl.manifest("cfg.yaml", manifest)
    assert kubectl("apply", "-f", path).stdout.strip() == "configmap/cfg configured"
    stored = emulator.get("configmaps", "cfg", "default")
    assert stored is not None and stored["data"] == {"a": "1", "c": "3"}  # `b` left the manifest, so it goes
    last_applied = json.loads(
        stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    )
    assert last_applied["data"] == {"a": "1", "c": "3"}
    assert kubectl("apply", "-f", path).stdout.strip() == "configmap/cfg unchanged"


def test_apply_a_pod_changes_only_what_may_change(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    manifest = pod("web")
    path = kubectl.manifest("pod.yaml", manifest)
    kubectl("apply", "-f", path)
    manifest["spec"]["containers"][0]["image"] = "registry.k8s.io/pause:3.10"
    manifest["metadata"]["labels"] = {"app": "web"}
    assert (
        kubectl("apply", "-f", kubectl.manifest("pod.yaml", manifest)).stdout.strip() == "pod/web configured"
    )
    stored = emulator.get("pods", "web", "default")
    assert stored is not None and stored["spec"]["containers"][0]["image"] == "registry.k8s.io/pause:3.10"
    assert stored["metadata"]["labels"] == {"app": "web"}


def test_server_side_apply(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    manifest: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}}
    path = kubectl.manifest("cfg.yaml", manifest)
    assert kubectl("apply", "--server-side", "-f", path).stdout.strip() == "configmap/cfg serverside-applied"
    manifest["data"] = {"a": "2"}
    kubectl("apply", "--server-side", "-f", kubectl.manifest("cfg.yaml", manifest))
    stored = emulator.get("configmaps", "cfg", "default")
    assert stored is not None and stored["data"] == {"a": "2"}


def test_replace(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    emulator.create("configmaps", {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    live = json.loads(kubectl("get", "cm", "cfg", "-o", "json").stdout)
    live["data"] = {"z": "26"}
    assert (
        kubectl("replace", "-f", kubectl.manifest("cfg.json", live)).stdout.strip()
        == "configmap/cfg replaced"
    )
    stale = kubectl("replace", "-f", kubectl.manifest("cfg.json", live), check=False)
    assert stale.returncode == 1 and "the object has been modified" in stale.stderr


def test_delete(kubectl: Kubectl, emulator: ApiServerEmulator) -> None:
    emulator.create("pods", pod("web"))
    emulator.create("nodes", node("gpu-1"))
    emulator.create("configmaps", {"metadata": {"name": "cfg"}})
    assert deleted('pod "web"', kubectl("delete", "pod", "web").stdout)
    assert deleted('node "gpu-1"', kubectl("delete", "node", "gpu-1").stdout)
    assert deleted('configmap "cfg"', kubectl("delete", "cm", "cfg").stdout)
    assert emulator.list("pods") == [] and emulator.list("nodes") == [] and emulator.list("configmaps") == []


def test_delete_waits_for_a_graceful_pod_deletion(kubectl_binary: str, tmp_path: Path) -> None:
    with running_emulator(graceful_pod_deletion=True) as emulator:
        kubectl = _kubectl(kubectl_binary, emulator, tmp_path)
        running_pod(emulator, "web", "gpu-1")
        process = kubectl.start("delete", "pod", "web")
        try:
            assert wait_until(
                lambda: (emulator.get("pods", "web", "default") or {})["metadata"].get("deletionTimestamp")
            )
            assert wait_until(lambda: emulator.requests.count(watch=True) == 1)  # kubectl waits by watching
            assert process.poll() is None
            emulator.finish_deletion("default", "web")
            out, _ = process.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            process.kill()
            process.wait()
        assert process.returncode == 0 and deleted('pod "web"', out)
