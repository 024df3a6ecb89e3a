"""The daemon's ClusterRole in daemonset.yaml against the calls the daemon really makes.

The real daemon (`deviceplugin run`, fake GPUs) runs against the API-server emulator and the
kubelet emulator through a flow that reaches each of its API paths: the pod cache (list, watch,
a dropped watch resumed), node state (annotations, status), Allocate's outbox (pod annotations,
the scheduler's node lock), events (a refused Allocate, an unhealthy GPU). Every request the
emulator answered is turned into the RBAC permission it needs, the way the API server does, and
the role must grant each of them and nothing else. Every write the daemon made must also pass
deploy/admission-policy.yaml, evaluated with the identity of a pod on the daemon's node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, GPU1, TIMEOUT_S, VGPU, Daemon, eventually, inject, streaming
from tests.deploy.admission import DAEMON_USER, admitted, pod_token_extra, recorded_writes
from tests.deploy.manifests import DAEMONSET, Access, documents, find, granted, request_access

NODE = "node-1"
NAMESPACE = "ml"


@pytest.fixture
def apiserver(apiserver: ApiServerEmulator) -> ApiServerEmulator:
    apiserver.create("nodes", {"metadata": {"name": NODE}, "status": {"capacity": {"cpu": "8"}}})
    apiserver.create("namespaces", {"metadata": {"name": NAMESPACE}})
    return apiserver


@pytest.fixture
def role() -> set[Access]:
    return granted(find(documents(DAEMONSET), "ClusterRole", "volcano-gpu-deviceplugin"))


def calls(apiserver: ApiServerEmulator) -> set[Access]:
    return {request_access(r.method, r.path, r.query) for r in apiserver.requests.records()}


def node(apiserver: ApiServerEmulator) -> dict[str, Any]:
    found = apiserver.get("nodes", NODE)
    assert found is not None
    return found


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def pod(
    apiserver: ApiServerEmulator, name: str, limits: dict[str, str], notes: dict[str, str]
) -> dict[str, Any]:
    return apiserver.create(
        "pods",
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": notes},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": limits}}],
            },
        },
    )


@pytest.fixture
def launch(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> Callable[..., tuple[Daemon, Path]]:
    def run(*args: str) -> tuple[Daemon, Path]:
        events = workdir / "events.jsonl"
        daemon = start(
            "--fake-gpus",
            "2x10989",
            "--fake-gpu-events",
            str(events),
            "--kubeconfig",
            str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
            "--health-recovery-period",
            "60",
            "--metrics-address",
            "127.0.0.1:0",  # a free port: other daemons may be running on this machine
            *args,
        )
        eventually(lambda: "pod cache listed" in daemon.output(), daemon)
        return daemon, events

    return run


def assert_writes_admitted(apiserver: ApiServerEmulator, since: int) -> set[str]:
    """Every write since `since` passes the admission policy as the daemon on NODE; returns what
    kinds of write there were (`nodes`, `nodes/status`, `pods`, `events`)."""
    writes = recorded_writes(apiserver, since, DAEMON_USER, pod_token_extra(NODE))
    for write in writes:
        allowed, denials = admitted(write)
        assert allowed, f"{write.operation} {write.resource}/{write.subresource}: {denials}"
    return {f"{w.resource}/{w.subresource}" if w.subresource else w.resource for w in writes}


def exercise_common(apiserver: ApiServerEmulator, daemon: Daemon, events: Path) -> None:
    """Paths every mode shares: a watch that drops and resumes, a GPU going unhealthy (event)."""
    apiserver.drop_watches()
    inject(events, xid=79, uuid=GPU1)
    eventually(
        lambda: any(e["reason"] == "GpuUnhealthy" for e in apiserver.list("events", "default")), daemon
    )
    eventually(lambda: apiserver.requests.count(watch=True) >= 2, daemon)


def test_share_mode_calls_are_exactly_what_the_role_grants(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    launch: Callable[..., tuple[Daemon, Path]],
    role: set[Access],
) -> None:
    apiserver.patch("nodes", NODE, {"metadata": {"annotations": {keys.GPUSHARE_LOCK: "taken"}}})
    since = apiserver.resource_version  # what follows is the daemon's, but the pods the test creates
    daemon, events = launch()
    assert kubelet.wait_for(streaming(keys.GPU_MEMORY), TIMEOUT_S), daemon.output()
    eventually(lambda: node(apiserver)["status"]["capacity"].get(keys.GPU_NUMBER) == "2", daemon)

    served = pod(
        apiserver, "served", {keys.GPU_MEMORY: "1024"}, {keys.GPU_INDEX: "0", keys.PREDICATE_TIME: "1"}
    )
    admission = kubelet.admit(served)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    eventually(
        lambda: (
            annotations_of(apiserver.get("pods", "served", NAMESPACE) or {}).get(keys.GPU_ASSIGNED) == "true"
        ),
        daemon,
    )
    eventually(lambda: keys.GPUSHARE_LOCK not in annotations_of(node(apiserver)), daemon)

    refused = pod(
        apiserver, "refused", {keys.GPU_MEMORY: "10"}, {keys.GPU_INDEX: "9", keys.PREDICATE_TIME: "2"}
    )
    assert not kubelet.admit(refused).admitted
    eventually(
        lambda: any(e["reason"] == "GpuAllocationFailed" for e in apiserver.list("events", NAMESPACE)), daemon
    )

    exercise_common(apiserver, daemon, events)
    eventually(lambda: annotations_of(node(apiserver)).get(keys.GPU_UNHEALTHY_IDS) == "1", daemon)

    made = calls(apiserver)
    assert not made - role, f"the daemon calls what its ClusterRole lacks: {sorted(map(str, made - role))}"
    assert not role - made, (
        f"the ClusterRole grants what the daemon never calls: {sorted(map(str, role - made))}"
    )
    assert assert_writes_admitted(apiserver, since) == {"nodes", "nodes/status", "pods", "events"}


def test_vgpu_mode_calls_are_all_granted(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    launch: Callable[..., tuple[Daemon, Path]],
    role: set[Access],
    workdir: Path,
) -> None:
    apiserver.patch("nodes", NODE, {"metadata": {"annotations": {keys.VGPU_LOCK: "taken"}}})
    since = apiserver.resource_version
    hook = workdir / "hook"
    hook.mkdir()
    (hook / "libvgpu.so").write_bytes(b"")  # the daemon only checks that HAMi-core is installed
    daemon, events = launch("--gpu-strategy", "vgpu", "--hook-path", str(hook))
    assert kubelet.wait_for(streaming(*VGPU), TIMEOUT_S), daemon.output()
    eventually(lambda: keys.NODE_VGPU_REGISTER in annotations_of(node(apiserver)), daemon)

    # A pod as the Volcano scheduler leaves it: served, then marked bind-phase success.
    devices = f"{GPU0},NVIDIA,1024,30:"
    placed = pod(
        apiserver,
        "placed",
        {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "1024", keys.VGPU_CORES: "30"},
        {
            keys.VGPU_NODE: NODE,
            keys.VGPU_TIME: "1",
            keys.VGPU_IDS_NEW: devices,
            keys.DEVICES_TO_ALLOCATE: devices,
            keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
            keys.BIND_TIME: "1",
        },
    )
    admission = kubelet.admit(placed)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    eventually(
        lambda: (
            annotations_of(apiserver.get("pods", "placed", NAMESPACE) or {}).get(keys.BIND_PHASE)
            == keys.BIND_PHASE_SUCCESS
        ),
        daemon,
    )
    eventually(lambda: keys.VGPU_LOCK not in annotations_of(node(apiserver)), daemon)
    exercise_common(apiserver, daemon, events)

    made = calls(apiserver)
    assert not made - role, f"the daemon calls what its ClusterRole lacks: {sorted(map(str, made - role))}"
    assert assert_writes_admitted(apiserver, since) == {"nodes", "pods", "events"}


@pytest.mark.parametrize(
    ("method", "path", "query", "wanted"),
    [
        ("GET", "/api/v1/pods", "fieldSelector=spec.nodeName%3Dn", Access("", "pods", "list")),
        ("GET", "/api/v1/pods", "watch=true&resourceVersion=7", Access("", "pods", "watch")),
        ("GET", "/api/v1/watch/namespaces/ml/pods", "", Access("", "pods", "watch")),
        ("GET", "/api/v1/namespaces/ml/pods/p", "", Access("", "pods", "get")),
        ("GET", "/api/v1/nodes/n", "", Access("", "nodes", "get")),
        ("GET", "/api/v1/namespaces/ml", "", Access("", "namespaces", "get")),
        ("PATCH", "/api/v1/nodes/n/status", "", Access("", "nodes/status", "patch")),
        ("POST", "/api/v1/namespaces/ml/pods/p/binding", "", Access("", "pods/binding", "create")),
        ("POST", "/api/v1/namespaces/ml/events", "", Access("", "events", "create")),
        ("PUT", "/api/v1/nodes/n", "", Access("", "nodes", "update")),
        ("DELETE", "/api/v1/namespaces/ml/pods/p", "", Access("", "pods", "delete")),
        ("DELETE", "/api/v1/namespaces/ml/pods", "", Access("", "pods", "deletecollection")),
        (
            "POST",
            "/apis/events.k8s.io/v1/namespaces/ml/events",
            "",
            Access("events.k8s.io", "events", "create"),
        ),
    ],
)
def test_requests_map_to_rbac_permissions_as_the_api_server_does(
    method: str, path: str, query: str, wanted: Access
) -> None:
    assert request_access(method, path, query) == wanted
