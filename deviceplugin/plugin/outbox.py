"""Applies the ledger's outbox: annotation patches queued by Allocate, sent in the background.

Entries survive restarts (they are ledger rows) and are retried with exponential back-off. A pass
takes the due entries naming up to `BATCH` pods or nodes and merges each one's entries into one
patch in ledger order (a later value, or a removal, wins); the entries merged are done, or
retried, together.

Dropped without a request, as the daemon's pod cache tells (a pod's entries carry its UID):
the entries of a pod the cache has seen deleted (a DELETED event, or missing from a relist), and
those queued before this worker started whose pod is absent from the cache once it has listed
(that list came after them); until the cache's first list such entries are held back. A pod the
cache has merely not seen (yet) is not taken for gone: its entries are sent and the API decides.
Dropped after a request: 404 (the object is gone) and 422 (refused as invalid), which no retry
can fix.

Pacing: while over a batch is due the batches follow one another at once (a backlog needs no
gathering); otherwise the worker waits for new entries, plus `BATCH_GAP_S`, or for the next
back-off to end.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

from deviceplugin.backoff import Backoff
from deviceplugin.fit import objects
from deviceplugin.kube.api import ApiError, Kube
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Ledger, OutboxEntry, Patch
from deviceplugin.ledgerfiles import StorageError
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

BATCH = 50  # pods and nodes per pass; the node's lock release is merged over a pass
# While entries from before the start wait for the pod cache's first list: how often to look.
IDLE_WAIT_S = 1.0
# The least pause between a pass and the one new entries woke. A lone Allocate's patches go out
# at once (Volcano binds no other pod to the node until its lock is released); in a burst of
# Allocates the entries gather, so the burst shares one lock release instead of one each and
# competes less with Allocate itself.
BATCH_GAP_S = 0.05
STORAGE_WAIT_S = 1.0  # while the ledger cannot be written: how often to look again
# Between tries of one target's patch, by its entries' attempts (kept in the ledger, so a restart
# does not start a failing backlog over): a backlog resent at once would flood the API server.
OUTBOX_RETRY = Backoff(start_s=0.5, max_s=60.0)
PERMANENT = frozenset({404, 422})
GONE_KEPT = 10_000  # UIDs of deleted pods remembered; an older one's entries are sent (and get 404)


def merged(entries: Sequence[OutboxEntry]) -> Patch:
    """One target's entries as one patch, later values winning."""
    annotations: dict[str, str | None] = {}
    for entry in entries:
        annotations.update(entry.patch.annotations)
    first = entries[0].patch
    return Patch(first.target, first.namespace, first.name, annotations, first.uid)


class OutboxWorker:
    """Made before its pod cache starts (the entries queued by then predate the cache's lists).
    Counts for the metrics: `batches` by what started the pass ("backlog": the previous one left
    over a batch due; "wait"), `entries` by outcome ("sent", "pod-gone": dropped unsent,
    "refused": dropped on 404 or 422, "retried")."""

    def __init__(
        self, ledger: Ledger, kube: Kube, pods: PodCache, supervisor: Supervisor | None = None
    ) -> None:
        self.ledger = ledger
        self.kube = kube
        self.pods = pods
        self.batches: Counter[str] = Counter()
        self.entries: Counter[str] = Counter()
        # Entries up to this id were queued before this worker, and so before any list of its cache.
        self._before = ledger.last_outbox_id()
        self._listed = False  # the cache has listed since
        self._gone: OrderedDict[str, None] = OrderedDict()  # UIDs of pods the cache saw deleted
        self._gone_lock = threading.Lock()
        pods.add_listener(self._on_pod)
        self._wake = threading.Event()
        self._worker = Worker("outbox", self._run, interrupt=self._wake.set, supervisor=supervisor)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def wake(self) -> None:
        """New entries are waiting: apply them now rather than at the next poll."""
        self._wake.set()

    def _on_pod(self, kind: str, pod: Mapping[str, object]) -> None:
        if kind != "DELETED":
            return
        with self._gone_lock:
            self._gone[objects.uid(pod)] = None
            if len(self._gone) > GONE_KEPT:
                self._gone.popitem(last=False)

    def _pod_gone(self, patch: Patch, first_id: int) -> bool:
        """Whether the cache tells the patch's pod is gone (see the module's docstring)."""
        if patch.target != "pod" or not patch.uid or self.pods.get(patch.uid) is not None:
            return False
        if first_id <= self._before:
            return self._listed
        with self._gone_lock:
            return patch.uid in self._gone

    def _held_through(self) -> int:
        """Pod entries up to this id wait for the cache's first list (0: none wait)."""
        self._listed = self._listed or self.pods.synced
        return 0 if self._listed else self._before

    def apply(self, patch: Patch) -> None:
        if patch.target == "pod":
            self.kube.patch_pod_annotations(patch.namespace, patch.name, patch.annotations)
            return
        # A node key to remove is removed with a JSON patch: when it is absent (Volcano took no
        # lock) nothing is written, where a merge patch would write a new node version for every
        # pod. Absent is what was wanted, so that counts as done.
        for key, value in patch.annotations.items():
            if value is None and not self.kube.remove_node_annotation(patch.name, key):
                log.debug("node annotation already absent", node=patch.name, key=key)
        kept = {key: value for key, value in patch.annotations.items() if value is not None}
        if kept:
            self.kube.patch_node(patch.name, {"metadata": {"annotations": kept}})

    def run_once(self, started_by: str = "wait") -> bool:
        """One pass over the due entries; returns whether over a batch was due (go on at once)."""
        held = self._held_through()
        entries = self.ledger.due(BATCH, held)
        # Under BATCH back: every due entry came (each takes its target's other entries along), so
        # only a full batch asks the ledger whether more wait.
        more = len(entries) >= BATCH and self.ledger.more_due_than(BATCH, held)
        groups: dict[tuple[str, str, str, str], list[OutboxEntry]] = {}
        for entry in entries:
            patch = entry.patch
            groups.setdefault((patch.target, patch.namespace, patch.name, patch.uid), []).append(entry)
        if groups:
            self.batches[started_by] += 1
        done: list[int] = []
        for group in groups.values():
            if self._worker.stopping.is_set():
                break
            if self._settle(merged(group), group):
                done.extend(entry.id for entry in group)
        if done:
            self.ledger.done(done)
        return more

    def _settle(self, patch: Patch, group: Sequence[OutboxEntry]) -> bool:
        """Send (or drop) one target's merged patch; whether its entries are done."""
        if self._pod_gone(patch, group[0].id):
            log.info("outbox patch dropped: the pod is gone", pod=f"{patch.namespace}/{patch.name}")
            self.entries["pod-gone"] += len(group)
            return True
        try:
            self.apply(patch)
        except ApiError as err:
            if err.status in PERMANENT:
                log.warning("outbox patch dropped", target=patch.name, error=str(err))
                self.entries["refused"] += len(group)
                return True
            delay = OUTBOX_RETRY.delay(1 + max(entry.attempts for entry in group))
            for entry in group:
                self.ledger.retry_later(entry.id, str(err), delay)
            self.entries["retried"] += len(group)
            return False
        self.entries["sent"] += len(group)
        return True

    def _idle_s(self) -> float | None:
        """How long to wait when no new entry comes: until the next back-off ends (None: no end),
        at most `IDLE_WAIT_S` while entries wait for the cache's first list."""
        held = self._held_through()
        due_in = self.ledger.due_in(held)
        wait = None if due_in is None else max(0.0, due_in)
        if held:
            return IDLE_WAIT_S if wait is None else min(wait, IDLE_WAIT_S)
        return wait

    def _run(self) -> None:
        started_by = "wait"
        while not self._worker.stopping.is_set():
            self._wake.clear()
            if self.ledger.problem() is not None:
                # Nothing is sent that could not be recorded as sent (or put off); the outbox
                # resumes, nothing lost, once the ledger's disk takes a write again.
                self._worker.stopping.wait(STORAGE_WAIT_S)
                continue
            try:
                backlog = self.run_once(started_by)
            except StorageError:  # a read the disk failed: the ledger's problem(), waited out above
                continue
            self._worker.turn()
            if backlog:
                started_by = "backlog"
                continue
            started_by = "wait"
            finished = time.monotonic()
            if self._wake.wait(self._idle_s()):
                self._worker.stopping.wait(finished + BATCH_GAP_S - time.monotonic())
