"""Frees ledger allocations of pods that are gone (SPEC §4).

Three signals: the pod cache reports a pod deleted or finished (at once); after the cache has
synced, ledger rows of pods it does not hold (deleted while the daemon was down); and kubelet's
pod-resources `List`, polled every `interval_s` (a tenth of a request per second, far below
kubelet's 100 QPS limit): a container absent from it for `grace_s` is released.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc

from deviceplugin.api import podresources_grpc
from deviceplugin.api import podresources_pb2 as pr
from deviceplugin.fit import objects
from deviceplugin.kube.api import Obj
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Ledger
from deviceplugin.logs import get_log
from deviceplugin.worker import Worker

log = get_log(__name__)

LIST_TIMEOUT_S = 10.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def list_containers(socket: Path) -> set[tuple[str, str, str]]:
    """(namespace, pod name, container) of everything kubelet has admitted, from pod-resources."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
        stub = podresources_grpc.PodResourcesListerStub(channel)
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=LIST_TIMEOUT_S)
    return {(p.namespace, p.name, c.name) for p in listed.pod_resources for c in p.containers}


class Releaser:
    def __init__(
        self,
        ledger: Ledger,
        pods: PodCache | None,
        pod_resources: Path,
        *,
        interval_s: float,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_released: Callable[[str], None] = lambda pod_uid: None,
    ) -> None:
        self.ledger = ledger
        self.pods = pods
        self.pod_resources = pod_resources
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.clock = clock
        self.on_released = on_released  # a pod's rows were released: free what it held on the host
        self._absent_since: dict[tuple[str, str, str], float] = {}
        self._warned = False
        self._worker = Worker("release", self._run)
        if pods is not None:
            pods.add_listener(self.on_pod)

    def _release(self, pod_uid: str, reason: str) -> None:
        if self.ledger.release_pod(pod_uid, reason):
            self.on_released(pod_uid)

    def on_pod(self, kind: str, pod: Obj) -> None:
        if kind == "DELETED":
            self._release(objects.uid(pod), "pod deleted")
        elif objects.is_terminal(pod):
            self._release(objects.uid(pod), f"pod {objects.phase(pod)}")

    def release_missing_pods(self) -> None:
        """Rows of pods the synced cache does not hold: they went away while nobody watched."""
        if self.pods is None or not self.pods.synced:
            return
        present = {objects.uid(pod) for pod in self.pods.pods()}
        for uid in {allocation.pod_uid for allocation in self.ledger.active()} - present:
            self._release(uid, "pod no longer on the node")

    def release_unlisted(self) -> None:
        """Rows whose container kubelet has not listed for the whole grace period."""
        try:
            listed = list_containers(self.pod_resources)
        except grpc.RpcError as err:
            if not self._warned:
                log.warning(
                    "pod-resources unavailable", socket=str(self.pod_resources), error=err.code().name
                )
                self._warned = True
            return
        self._warned = False
        now = self.clock()
        live = set()
        for allocation in self.ledger.active():
            key = (allocation.namespace, allocation.pod_name, allocation.container)
            live.add(key)
            if key in listed:
                self._absent_since.pop(key, None)
                continue
            since = self._absent_since.setdefault(key, now)
            if now - since >= self.grace_s:
                self._release(allocation.pod_uid, f"container {allocation.container} not in pod-resources")
        self._absent_since = {key: since for key, since in self._absent_since.items() if key in live}

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self) -> None:
        while not self._worker.stopping.wait(self.interval_s):
            self.release_missing_pods()
            self.release_unlisted()
            self.ledger.purge()
