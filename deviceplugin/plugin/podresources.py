"""Kubelet's pod-resources `List`, read into what the daemon asks of it: which active pod's
container holds which device IDs (SPEC §1: the only ground truth for reconciliation).

Kubelet lists the pods in its pod manager that are not terminal, the one it is admitting included
(added before admission), each sidecar and app container with the devices recorded so far: each
resource's devices are recorded as soon as its Allocate returns. Run-to-completion init containers
are never listed. An answer names every device ID of every pod (one per MiB in share mode), so a
`Listing` reads only what it is asked: the pods up front, a container's devices when asked for
them, the index from device to holder on first use.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import cached_property
from pathlib import Path

import grpc

from deviceplugin.api import podresources_grpc
from deviceplugin.api import podresources_pb2 as pr
from deviceplugin.fit import objects

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_reconnect_backoff_ms", 1000),  # kubelet restarts: back within a second
]

ContainerRef = tuple[str, str, str]  # (namespace, pod name, container)


def listable(pod: objects.Obj, container: str) -> bool:
    """Kubelet lists the container while the pod is active: a sidecar or an app container, not
    a run-to-completion init container."""
    for each in objects.init_containers(pod):
        if objects.container_name(each) == container:
            return each.get("restartPolicy") == "Always"
    return True


class Listing:
    """One `List` answer."""

    def __init__(self, response: pr.ListPodResourcesResponse) -> None:
        self._response = response
        self.pods = {(pod.namespace, pod.name): pod for pod in response.pod_resources}

    def lists(self, namespace: str, pod: str, container: str) -> bool:
        """Kubelet lists the container (an active pod's sidecar or app container)."""
        listed = self.pods.get((namespace, pod))
        return listed is not None and any(c.name == container for c in listed.containers)

    def holding(self, namespace: str, pod: str, container: str) -> Mapping[str, frozenset[str]]:
        """Resource -> device IDs the container holds (empty when it holds none or is not listed)."""
        listed = self.pods.get((namespace, pod))
        for each in listed.containers if listed is not None else ():
            if each.name == container:
                held: dict[str, set[str]] = {}
                for entry in each.devices:  # one entry per device and NUMA node
                    held.setdefault(entry.resource_name, set()).update(entry.device_ids)
                return {resource: frozenset(ids) for resource, ids in held.items()}
        return {}

    @cached_property
    def _holders(self) -> dict[tuple[str, str], ContainerRef]:
        return {
            (entry.resource_name, device): (pod.namespace, pod.name, container.name)
            for pod in self._response.pod_resources
            for container in pod.containers
            for entry in container.devices
            for device in entry.device_ids
        }

    def holds_any(self, resources: Collection[str]) -> bool:
        """Some container holds devices of one of `resources`."""
        return any(resource in resources for resource, _ in self._holders)

    def holder(self, resource: str, device_id: str) -> ContainerRef | None:
        """The container kubelet gave this device of `resource` to, if any."""
        return self._holders.get((resource, device_id))


def list_with(channel: grpc.Channel, timeout_s: float) -> Listing:
    """Call `List` over an open channel; raises `grpc.RpcError` (kubelet answers
    RESOURCE_EXHAUSTED over its rate limit of 100 calls per second, burst 10)."""
    stub = podresources_grpc.PodResourcesListerStub(channel)
    return Listing(stub.List(pr.ListPodResourcesRequest(), timeout=timeout_s))


def connect(socket: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{socket}", options=CHANNEL_OPTIONS)


def read_listing(socket: Path, timeout_s: float) -> Listing:
    """`List` on a channel of its own."""
    with connect(socket) as channel:
        return list_with(channel, timeout_s)
