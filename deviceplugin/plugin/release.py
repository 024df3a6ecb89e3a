"""Frees ledger allocations of pods that are gone, and checks the ledger against kubelet (SPEC §4).

Three signals free rows: the pod cache reports a pod deleted or finished (at once); after the
cache has synced, ledger rows of pods it does not hold (deleted while the daemon was down); and
kubelet's pod-resources `List`, polled every `interval_s` (a tenth of a request per second, far
below kubelet's 100 QPS limit): a row neither whose container nor whose device IDs it shows for
`grace_s` is released. The same `List` answer first goes to the reconcilers (`add_reconciler`),
which give rows kubelet's records show under another container to that container
(`PodAllocator.reconcile`); while a pod has a row they have yet to confirm, only that check
releases it (its devices may be another pod's container's), unless `List` never answered. A
ledger `Ledger.open` replaced is rebuilt from the first `List` that answers once the pod cache
has synced (`recover`): tried at `start`, before the daemon registers with kubelet, then by
every pass until done.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence, Set
from pathlib import Path
from typing import Protocol

import grpc

from deviceplugin.fit import objects
from deviceplugin.kube.api import Obj
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Allocation, Key, Ledger
from deviceplugin.ledgerfiles import StorageError
from deviceplugin.logs import get_log
from deviceplugin.plugin.podresources import Listing, listable, read_listing
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

LIST_TIMEOUT_S = 10.0
REBUILD_WAIT_S = 10.0  # at start, how long a ledger rebuild waits for the pod cache's first list


class Reconciler(Protocol):
    def reconcile(self, listing: Listing) -> int: ...

    def unverified(self) -> Set[Key]: ...

    def rebuild(self, listing: Listing) -> tuple[list[Allocation], list[str]]: ...


# Rebuilds a replaced ledger from a `List` answer and the reconcilers (`recover.rebuild_ledger`).
Rebuild = Callable[[Listing, Sequence[Reconciler]], object]


def held(allocation: Allocation, listing: Listing) -> bool:
    """Kubelet still lists the row's container, or a container holding its device IDs (a row
    recorded under another pod's name keeps its devices until that is corrected)."""
    return listing.lists(allocation.namespace, allocation.pod_name, allocation.container) or any(
        listing.holder(allocation.resource, device) for device in allocation.device_ids[:1]
    )


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
        supervisor: Supervisor | None = None,
        rebuild: Rebuild | None = None,
    ) -> None:
        self.ledger = ledger
        self.pods = pods
        self.pod_resources = pod_resources
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.clock = clock
        self.on_released = on_released  # a pod's rows were released: free what it held on the host
        # Per row incarnation (its key and when it was recorded): a row recorded again after a
        # release, or for a pod recreated under the same name, waits a grace period of its own.
        self._absent_since: dict[tuple[str, str, str, float], float] = {}
        self._warned = False
        # Kubelet's `List` answered since start (over its rate limit counts: kubelet is there and
        # a later call gets through); False: asked and never answered (no socket mounted), so
        # there is no check to leave a release to; None: not asked yet.
        self._answered: bool | None = None
        self._reconcilers: list[Reconciler] = []
        self._rebuild = rebuild  # pending until a `List` answers with the pod cache synced
        self._worker = Worker("release", self._run, supervisor=supervisor)
        if pods is not None:
            pods.add_listener(self.on_pod)

    def _release(self, pod_uid: str, reason: str, *, listed: bool = False) -> None:
        """`listed`: kubelet's records show nobody holds the rows' devices. When `List` never
        answered there is no check to wait for: the pod's rows go now."""
        unverified = (key[0] == pod_uid for r in self._reconcilers for key in r.unverified())
        if not listed and self._answered is not False and any(unverified):
            log.info("release left to the pod-resources check", pod_uid=pod_uid, reason=reason)
            return
        try:
            released = self.ledger.release_pod(pod_uid, reason)
        except StorageError:  # the ledger reports its disk; a later pass releases the rows
            log.warning("release put off: the ledger cannot be written", pod_uid=pod_uid, reason=reason)
            return
        if released:
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

    def add_reconciler(self, reconciler: Reconciler) -> None:
        """Hand every `List` answer to `reconciler` as well (from the release thread)."""
        self._reconcilers.append(reconciler)

    def check_with_kubelet(self) -> None:
        """One `List`: the reconcilers, then the release of rows kubelet no longer shows."""
        try:
            listing = read_listing(self.pod_resources, LIST_TIMEOUT_S)
        except grpc.RpcError as err:
            if not self._warned:
                log.warning(
                    "pod-resources unavailable", socket=str(self.pod_resources), error=err.code().name
                )
                self._warned = True
            self._answered = self._answered or err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return
        self._warned = False
        self._answered = True
        if self._rebuild is not None and self.pods is not None and self.pods.synced:
            try:
                self._rebuild(listing, self._reconcilers)
                self._rebuild = None
            except StorageError:  # the ledger reports its disk; the next pass tries again
                log.warning("ledger rebuild put off: the ledger cannot be written")
        for reconciler in self._reconcilers:
            try:
                reconciler.reconcile(listing)
            except Exception as err:  # a failed correction must not end the release loop
                log.error("reconcile failed", error=repr(err))
        self.release_unlisted(listing)

    def release_unlisted(self, listing: Listing) -> None:
        """Rows kubelet has not shown (`held`) for the whole grace period. A run-to-completion
        init container is never listed: its rows go with its pod."""
        now = self.clock()
        live = set()
        for allocation in self.ledger.active():
            key = (allocation.pod_uid, allocation.container, allocation.resource, allocation.allocated_at)
            live.add(key)
            pod = self.pods.get(allocation.pod_uid) if self.pods is not None else None
            if held(allocation, listing) or (pod is not None and not listable(pod, allocation.container)):
                self._absent_since.pop(key, None)
                continue
            since = self._absent_since.setdefault(key, now)
            if now - since >= self.grace_s:
                reason = f"container {allocation.container} not in pod-resources"
                self._release(allocation.pod_uid, reason, listed=True)
        self._absent_since = {key: since for key, since in self._absent_since.items() if key in live}

    def start(self) -> None:
        """Start the loop; a ledger rebuild is tried first, here: the daemon registers with kubelet
        after this, and an Allocate must not take a container served before for one waiting."""
        if self._rebuild is not None and self.pods is not None:
            self.pods.wait_synced(REBUILD_WAIT_S)
            self.check_with_kubelet()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self) -> None:
        while not self._worker.stopping.wait(self.interval_s):
            self.release_missing_pods()
            self.check_with_kubelet()
            with contextlib.suppress(StorageError):  # the next pass purges
                self.ledger.purge()
            self._worker.turn()
