"""Kubelet's node status for an emulated node, kept on the API server over HTTP.

Attached to a kubelet emulator as its listener, it writes what kubelet writes: the node's Lease in
kube-node-lease (kubelet's heartbeat) and the four node conditions (Ready with `KubeletReady`), both
renewed every `heartbeat_s`, `lastTransitionTime` kept until a status changes; capacity and
allocatable (the machine's cpu, memory, ephemeral-storage and pods, and each device-plugin resource:
every device as capacity, the healthy ones as allocatable); addresses and system info. It writes
again as soon as the kubelet emulator reports a change. Once the kubelet emulator stops, nobody
posts: the node lifecycle controller would mark every condition Unknown after its grace period, and
this does it at once. `kubectl get nodes` then shows NotReady; a `NodeReady` / `NodeNotReady` Event
marks each change.
"""

from __future__ import annotations

import platform
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import kubernetes
import urllib3

from deviceplugin import __version__
from deviceplugin.kube.api import ApiError, Kube, Obj
from deviceplugin.kube.events import Involved, event_body
from deviceplugin.logs import get_log
from deviceplugin.worker import Worker
from kubesim.apiserver.discovery import SERVER_VERSION
from kubesim.apiserver.meta import rfc3339
from kubesim.kubelet import KubeletEvent
from kubesim.podstatus import RUNTIME

log = get_log(__name__)

#: Kubelet's default nodeStatusUpdateFrequency.
HEARTBEAT_S = 10.0
KUBELET_PORT = 10250
LEASE_NAMESPACE = "kube-node-lease"
#: Kubelet's nodeLeaseDurationSeconds.
LEASE_DURATION_S = 40
_APPLY_PATCH = "application/apply-patch+yaml"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
# (type, reason and message while kubelet posts); the pressure conditions are never raised here.
_CONDITIONS = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "KubeletReady", "kubelet is posting ready status"),
)
_UNKNOWN_REASON = "NodeStatusUnknown"
_UNKNOWN_MESSAGE = "Kubelet stopped posting node status."


@dataclass(frozen=True)
class Machine:
    """What the emulated node reports of its own hardware (quantities as the API writes them)."""

    cpu: str = "8"
    memory: str = "32Gi"
    ephemeral_storage: str = "100Gi"
    pods: str = "110"
    address: str = "127.0.0.1"

    def resources(self) -> dict[str, str]:
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "ephemeral-storage": self.ephemeral_storage,
            "pods": self.pods,
        }


class NodeStatusReporter:
    """Pass `kubelet_event` as the kubelet emulator's listener, then `start()` (before or after the
    kubelet emulator starts); `stop()` ends the loop and writes nothing more."""

    def __init__(
        self,
        node: str,
        kube: Kube,
        machine: Machine | None = None,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.machine = machine or Machine()
        self._kube = kube
        self._leases = kubernetes.client.CoordinationV1Api(kube.client)
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._kubelet_up = False
        self._devices: dict[str, tuple[int, int]] = {}  # resource -> (healthy, total)
        # What the node shows now: None before the first write, else True (Ready) or False (Unknown).
        self._posted_ready: bool | None = None
        self._transition = ""  # when the posted status last changed
        self._heartbeat = ""  # when kubelet last posted
        self._boot_id = str(uuid.uuid4())
        self._uid = ""  # the Node's, once read
        self._worker = Worker(f"node-status-{node}", self._run, interrupt=self._wake.set)

    # ---------------------------------------------------------------- the kubelet's side

    def kubelet_event(self, event: KubeletEvent) -> None:
        """The kubelet emulator's listener: called under its lock, so it only notes and wakes."""
        with self._lock:
            if event.kind in ("serving", "restarted"):
                self._kubelet_up = True
            elif event.kind == "stopped":
                self._kubelet_up = False
            elif event.kind in ("registered", "devices", "disconnected"):
                self._devices[event.resource] = (event.healthy, event.total)
            else:
                return
        self._wake.set()

    # ---------------------------------------------------------------- the loop

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            self._wake.clear()  # before reading the state: a change from now on wakes the wait below
            try:
                self._post()
            except ApiError as error:  # the next heartbeat or change tries again
                log.warning("node status not written", node=self.node, error=str(error))
            self._wake.wait(self._heartbeat_s)

    def _post(self) -> None:
        with self._lock:
            up, devices = self._kubelet_up, dict(self._devices)
        if not up and not self._posted_ready:
            return  # never posted, or already marked Unknown: nothing posts for a stopped kubelet
        now = rfc3339(self._clock())
        changed = up != self._posted_ready
        if changed:
            self._transition = now
        status = self._status(devices, now) if up else {"conditions": self._unknown(now)}
        self._kube.patch_node_status(self.node, {"status": status})
        self._posted_ready = up
        if up:
            self._heartbeat = now
            self._renew_lease(self._node_uid())
        if changed:
            self._record(up)

    def _node_uid(self) -> str:
        """The Node's UID, which owns its Lease (the product's PATCH answers nothing: read once)."""
        if not self._uid:
            self._uid = str(self._kube.get_node(self.node)["metadata"]["uid"])
        return self._uid

    def _renew_lease(self, node_uid: str) -> None:
        """Create or renew the node's Lease (one server-side apply does both), owned by the Node."""
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid}
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(self._clock())),
            },
        }
        try:
            self._leases.patch_namespaced_lease(
                self.node,
                LEASE_NAMESPACE,
                lease,
                field_manager="kubelet",
                _content_type=_APPLY_PATCH,
                _preload_content=False,
            )
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            log.warning("node lease not renewed", node=self.node, error=str(error))

    def _record(self, ready: bool) -> None:
        """`NodeReady` from kubelet, or `NodeNotReady` from the node lifecycle controller."""
        reason = "NodeReady" if ready else "NodeNotReady"
        component = "kubelet" if ready else "node-controller"
        # Kubelet's node events name the node as its UID; `kubectl describe node` looks for both.
        event = event_body(
            Involved.node(self.node, uid=self.node),
            "Normal",
            reason,
            f"Node {self.node} status is now: {reason}",
            self.node,
        )
        event |= {"source": {"component": component, "host": self.node}, "reportingComponent": component}
        self._kube.create_event("default", event)

    # ---------------------------------------------------------------- what is written

    def _status(self, devices: dict[str, tuple[int, int]], now: str) -> Obj:
        machine = self.machine.resources()
        return {
            "capacity": machine | {name: str(total) for name, (_, total) in devices.items()},
            "allocatable": machine | {name: str(healthy) for name, (healthy, _) in devices.items()},
            "conditions": [
                {
                    "type": kind,
                    "status": "True" if kind == "Ready" else "False",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": self._transition,
                    "reason": reason,
                    "message": message,
                }
                for kind, reason, message in _CONDITIONS
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.machine.address},
                {"type": "Hostname", "address": self.node},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "nodeInfo": self._node_info(),
        }

    def _unknown(self, now: str) -> list[Obj]:
        """The conditions as the node lifecycle controller leaves them: the last heartbeat stays."""
        return [
            {
                "type": kind,
                "status": "Unknown",
                "lastHeartbeatTime": self._heartbeat,
                "lastTransitionTime": now,
                "reason": _UNKNOWN_REASON,
                "message": _UNKNOWN_MESSAGE,
            }
            for kind, _, _ in _CONDITIONS
        ]

    def _node_info(self) -> Obj:
        identity = str(uuid.uuid5(uuid.NAMESPACE_DNS, self.node))
        return {
            "machineID": identity.replace("-", ""),
            "systemUUID": identity,
            "bootID": self._boot_id,
            "kernelVersion": platform.release(),
            "osImage": _os_image(),
            "containerRuntimeVersion": f"{RUNTIME}://{__version__}",
            "kubeletVersion": SERVER_VERSION["git"],
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": _ARCHITECTURES.get(platform.machine(), platform.machine()),
        }


def _os_image() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", "Linux")
    except OSError:
        return "Linux"
