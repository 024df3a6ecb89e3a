"""The pod status kubelet writes once it has started a pod, or refused it: what `kubectl get pods`
reads for READY, STATUS and RESTARTS, and `kubectl describe pod` for conditions and container state.

Both are strategic-merge patches of `status`: the PodScheduled condition the binding set stays.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from kubesim.apiserver.meta import Obj

#: Kubelet's pod conditions once the containers run, in the order kubelet lists them.
_STARTED_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
#: What the emulated runtime calls itself in container IDs (`<runtime>://<id>`).
RUNTIME = "sim"


def started(pod: Mapping[str, Any], *, host_ip: str, pod_ip: str, at: str) -> Obj:
    """Every init container ran to completion and every app container runs, ready, never restarted."""
    spec = pod.get("spec") or {}
    conditions = [{"type": kind, "status": "True", "lastTransitionTime": at} for kind in _STARTED_CONDITIONS]
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": at,
        "initContainerStatuses": [_init(c, at) for c in spec.get("initContainers") or []],
        "containerStatuses": [_running(c, at) for c in spec.get("containers") or []],
    }


def rejected(reason: str, message: str) -> Obj:
    """Admission refused the pod (kubelet's `rejectPod`): Failed, with why; no container was made."""
    return {"phase": "Failed", "reason": reason, "message": message}


def _container(container: Mapping[str, Any], state: Obj, container_id: str, *, started: bool) -> Obj:
    return {
        "name": container.get("name", ""),
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": container_id,
        "ready": True,
        "started": started,
        "restartCount": 0,
        "state": state,
        "lastState": {},
    }


def _running(container: Mapping[str, Any], at: str) -> Obj:
    return _container(container, {"running": {"startedAt": at}}, _container_id(), started=True)


def _init(container: Mapping[str, Any], at: str) -> Obj:
    """A sidecar (an init container that restarts always) keeps running; any other has completed."""
    if container.get("restartPolicy") == "Always":
        return _running(container, at)
    container_id = _container_id()
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": at,
        "finishedAt": at,
        "containerID": container_id,
    }
    return _container(container, {"terminated": terminated}, container_id, started=False)


def _container_id() -> str:
    return f"{RUNTIME}://{uuid.uuid4().hex}"
