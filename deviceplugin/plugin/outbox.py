"""Applies the ledger's outbox: annotation patches queued by Allocate, sent in the background.

Entries survive restarts (they are ledger rows), are retried with exponential back-off, and are
dropped only when the object is gone (404) or the patch is refused as invalid (422), both of
which no retry can fix.
"""

from __future__ import annotations

import threading
import time

from deviceplugin.kube.api import ApiError, Kube
from deviceplugin.ledger import Ledger, Patch
from deviceplugin.logs import get_log
from deviceplugin.worker import Worker

log = get_log(__name__)

IDLE_WAIT_S = 1.0
# The least pause between two batches. A lone Allocate's patches go out at once (Volcano binds
# no other pod to the node until its lock is released); in a burst of Allocates the entries
# gather, so the burst shares one lock release instead of one each and competes less with
# Allocate itself.
BATCH_GAP_S = 0.05
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 60.0
PERMANENT = frozenset({404, 422})


class OutboxWorker:
    def __init__(self, ledger: Ledger, kube: Kube) -> None:
        self.ledger = ledger
        self.kube = kube
        self._wake = threading.Event()
        self._worker = Worker("outbox", self._run, interrupt=self._wake.set)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def wake(self) -> None:
        """New entries are waiting: apply them now rather than at the next poll."""
        self._wake.set()

    def apply(self, patch: Patch) -> None:
        if patch.target == "pod":
            self.kube.patch_pod_annotations(patch.namespace, patch.name, patch.annotations)
            return
        # A node key to remove is removed with a JSON patch: when it is absent (Volcano took no
        # lock) the server refuses with 422 and writes nothing, where a merge patch would write a
        # new node version for every pod. Absent is what was wanted, so 422 counts as done.
        for key, value in patch.annotations.items():
            if value is None:
                try:
                    self.kube.remove_node_annotation(patch.name, key)
                except ApiError as err:
                    if err.status != 422:
                        raise
                    log.debug("node annotation already absent", node=patch.name, key=key)
        kept = {key: value for key, value in patch.annotations.items() if value is not None}
        if kept:
            self.kube.patch_node(patch.name, {"metadata": {"annotations": kept}})

    def run_once(self) -> int:
        """Apply every due entry once (identical patches once); returns how many are left."""
        applied: dict[Patch, ApiError | None] = {}
        done: list[int] = []
        for entry in self.ledger.due():
            if self._worker.stopping.is_set():
                break
            key = entry.patch
            if key not in applied:
                try:
                    self.apply(key)
                    applied[key] = None
                except ApiError as err:
                    applied[key] = err
            error = applied[key]
            if error is None or error.status in PERMANENT:
                if error is not None:
                    log.warning("outbox patch dropped", target=entry.patch.name, error=str(error))
                done.append(entry.id)
            else:
                self.ledger.retry_later(
                    entry.id, str(error), min(BACKOFF_START_S * 2**entry.attempts, BACKOFF_MAX_S)
                )
        if done:
            self.ledger.done(done)
        return self.ledger.outbox_size()

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            self._wake.clear()
            self.run_once()
            finished = time.monotonic()
            if self._wake.wait(IDLE_WAIT_S):
                self._worker.stopping.wait(finished + BATCH_GAP_S - time.monotonic())
