"""What the daemon keeps of each pod on its node (`plugin.podfields.daemon_pod`, issue 15 item 4):
every decision the daemon takes from a pod is the same on the projection as on the pod as served,
and the projection holds none of the rest (managedFields, images, env, probes, volumes, status
conditions: most of a served pod's memory)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given

from deviceplugin.config import load_config
from deviceplugin.fit import keys, objects
from deviceplugin.kube.events import Involved
from deviceplugin.kube.rejections import display
from deviceplugin.plugin.daemon import Daemon
from deviceplugin.plugin.gpushare import read_gpushare_pod
from deviceplugin.plugin.pending import asks_for, finished, pod_identity
from deviceplugin.plugin.podfields import DISABLE_CONTROL, daemon_pod
from deviceplugin.plugin.podresources import listable
from deviceplugin.plugin.vgpu import read_vgpu_pod
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import TIMEOUT_S
from tests.fuzz import FUZZ, RESOURCES, pods
from tests.kube.waiting import wait_for

NODE = "node-a"
NAMES = ("sidecar", "setup", "server", "a", "b", "c")  # SERVED's containers and the fuzzed pods'


def served_pod(phase: str = "Running", **annotations: str) -> dict[str, Any]:
    """A vGPU pod as the API server serves it once a ReplicaSet created it, Volcano bound it and
    kubelet runs it: a sidecar and a run-to-completion init container, an app container that
    turns HAMi-core off, and everything else a real pod carries that the daemon never reads."""
    limits = {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "2000", "cpu": "2"}
    notes = {
        keys.VGPU_NODE: NODE,
        keys.VGPU_TIME: "1764000000",
        keys.DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,2000,0:",
        keys.BIND_PHASE: "allocating",
        keys.KUBE_GROUP_NAME: "train-1",
        "kubectl.kubernetes.io/restartedAt": "2026-11-25T10:00:00Z",
        **annotations,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-1-7d9c6b5f4d-x2k9p",
            "generateName": "train-1-7d9c6b5f4d-",
            "namespace": "ml",
            "uid": "0b7c9f52-8f43-4d55-9a38-4c1f3f0e8a11",
            "resourceVersion": "81234",
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"app": "train", "pod-template-hash": "7d9c6b5f4d"},
            "annotations": notes,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-1-7d9c6b5f4d", "uid": "r1"}
            ],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:spec": {}}}
            ],
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": "volcano",
            "initContainers": [
                {"name": "sidecar", "image": "proxy:1", "restartPolicy": "Always", "resources": {}},
                {"name": "setup", "image": "setup:1", "command": ["/setup"]},
            ],
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example.com/ml/train:2.14.1",
                    "env": [{"name": "MODEL", "value": "m"}, {"name": DISABLE_CONTROL, "value": "true"}],
                    "resources": {"limits": limits, "requests": {"cpu": "1", "memory": "4Gi"}},
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                    "volumeMounts": [{"name": "token", "mountPath": "/var/run/secrets"}],
                }
            ],
            "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {}}]}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True"}],
            "podIP": "10.244.3.91",
            "containerStatuses": [{"name": "server", "ready": True, "restartCount": 0}],
        },
    }


def terminating_pod() -> dict[str, Any]:
    pod = served_pod()
    pod["metadata"]["deletionTimestamp"] = "2026-11-25T11:00:00Z"
    return pod


# Every reading the daemon makes of a cached pod: its candidates per resource (gpushare and vGPU,
# with their problems and serving order), whether it asks for the node's resources, is finished,
# its identity, which containers kubelet lists, what events and rejections name it by, what
# releases read.
READERS: dict[str, Callable[[Any], object]] = {
    "gpu-memory candidate": lambda pod: read_gpushare_pod(pod, keys.GPU_MEMORY),
    "gpu-number candidate": lambda pod: read_gpushare_pod(pod, keys.GPU_NUMBER),
    "vgpu-number candidate": lambda pod: read_vgpu_pod(pod, NODE, keys.VGPU_NUMBER),
    "vgpu-memory candidate": lambda pod: read_vgpu_pod(pod, NODE, keys.VGPU_MEMORY),
    "asks for the node's resources": lambda pod: asks_for(pod, RESOURCES),
    "finished": finished,
    "identity": pod_identity,
    "listed by kubelet": lambda pod: [listable(pod, name) for name in NAMES],
    "event object": Involved.pod,
    "rejection name": display,
    "release": lambda pod: (objects.uid(pod), objects.is_terminal(pod), objects.phase(pod)),
}


def decisions(pod: Any) -> dict[str, object]:
    """Each reader's answer, or the error it raised (type and message)."""
    answers: dict[str, object] = {}
    for name, read in READERS.items():
        try:
            answers[name] = read(pod)
        except Exception as err:
            answers[name] = (type(err).__name__, str(err))
    return answers


@FUZZ
@given(pods)
@example(served_pod())
@example(served_pod(**{keys.BIND_PHASE: "success"}))
@example(served_pod(**{keys.GPU_INDEX: "0", keys.PREDICATE_TIME: "1764000000000000000"}))
@example(served_pod("Succeeded"))
@example(terminating_pod())
def test_the_daemon_decides_the_same_on_the_projection_as_on_the_pod_as_served(pod: Any) -> None:
    assert decisions(daemon_pod(pod)) == decisions(pod)


def test_the_examples_reach_every_field_the_daemon_reads() -> None:
    """The pinned examples above guard a field only if some reader's answer depends on it."""
    pod = served_pod()
    candidate = read_vgpu_pod(pod, NODE, keys.VGPU_NUMBER)
    assert candidate is not None and candidate.uncontrolled == {"server"}  # env
    assert [listable(pod, name) for name in ("sidecar", "setup")] == [True, False]  # restartPolicy
    assert pod_identity(pod)[3] == "2026-11-25T10:00:00Z"  # creationTimestamp
    assert finished(terminating_pod()) and finished(served_pod("Succeeded"))  # deletion, phase


def test_the_projection_keeps_only_what_the_daemon_reads() -> None:
    meta = served_pod()["metadata"]
    notes = {key: value for key, value in meta["annotations"].items() if key.startswith("volcano.sh/")}
    assert daemon_pod(served_pod()) == {
        "metadata": {
            "name": meta["name"],
            "namespace": "ml",
            "uid": meta["uid"],
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "annotations": notes,
        },
        "spec": {
            "nodeName": NODE,
            "initContainers": [{"name": "sidecar", "restartPolicy": "Always"}, {"name": "setup"}],
            "containers": [
                {
                    "name": "server",
                    "resources": {"limits": {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "2000", "cpu": "2"}},
                    "env": [{"name": DISABLE_CONTROL}],
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def _held(value: Any) -> Iterator[Any]:
    """The dicts, lists and strings in a JSON value (not the 0- and 1-character strings: CPython
    keeps one object for each of them)."""
    if isinstance(value, dict):
        yield value
        for key, item in value.items():
            yield from _held(key)
            yield from _held(item)
    elif isinstance(value, list):
        yield value
        for item in value:
            yield from _held(item)
    elif isinstance(value, str) and len(value) > 1:
        yield value


def test_pods_of_one_template_share_their_spec_and_hold_nothing_of_the_pod_as_served() -> None:
    """A kept string of the served pod would pin the allocator arena its whole list was parsed
    into; equal specs and statuses are one object, so a pod costs its identity and annotations."""
    other = served_pod()
    other["metadata"]["name"], other["metadata"]["uid"] = "train-1-7d9c6b5f4d-q8r2z", "u2"
    first, second = (json.loads(json.dumps(pod)) for pod in (served_pod(), other))  # as a client parses
    kept = [daemon_pod(first), daemon_pod(second)]
    assert kept[0]["spec"] is kept[1]["spec"] and kept[0]["status"] is kept[1]["status"]
    served = {id(part) for part in _held([first, second])}
    assert [part for part in _held(kept) if id(part) in served] == []


@pytest.fixture
def daemon(workdir: Path, kubelet: KubeletEmulator, apiserver: ApiServerEmulator) -> Iterator[Daemon]:
    apiserver.create("nodes", {"metadata": {"name": NODE}})
    apiserver.create("namespaces", {"metadata": {"name": "ml"}})
    config = load_config(
        {
            "node-name": NODE,
            "gpu-strategy": "vgpu",
            "fake-gpus": "2x4000",
            "device-plugin-dir": str(workdir / "plugins"),
            "pod-resources-socket": str(workdir / "pod-resources.sock"),
            "state-dir": str(workdir / "state"),
            "kubeconfig": str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
        },
        {},
    )
    running = Daemon(config, {})
    yield running
    running.stop()


def test_the_daemons_pod_cache_keeps_the_projection(daemon: Daemon, apiserver: ApiServerEmulator) -> None:
    pod = served_pod()
    del pod["metadata"]["uid"], pod["metadata"]["resourceVersion"], pod["metadata"]["creationTimestamp"]
    uid = apiserver.create("pods", copy.deepcopy(pod))["metadata"]["uid"]
    assert daemon.services.kube is not None
    cache = daemon.services.kube.pods
    assert wait_for(lambda: cache.get(uid) is not None, TIMEOUT_S)
    as_served = apiserver.get("pods", pod["metadata"]["name"], "ml")
    assert as_served is not None and "managedFields" in as_served["metadata"]
    assert cache.pods() == [daemon_pod(as_served)]
