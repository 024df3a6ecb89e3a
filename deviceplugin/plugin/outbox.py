"""Applies the ledger's outbox: annotation patches queued by Allocate, sent in the background.

Entries survive restarts (they are ledger rows), are retried with exponential back-off, and are
dropped only when the object is gone (404) or the patch is refused as invalid (422), both of
which no retry can fix.
"""

from __future__ import annotations

import threading

from deviceplugin.kube.api import ApiError, Kube
from deviceplugin.ledger import Ledger, OutboxEntry
from deviceplugin.logs import get_log

log = get_log(__name__)

IDLE_WAIT_S = 1.0
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 60.0
PERMANENT = frozenset({404, 422})


class OutboxWorker:
    def __init__(self, ledger: Ledger, kube: Kube) -> None:
        self.ledger = ledger
        self.kube = kube
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        """New entries are waiting: apply them now rather than at the next poll."""
        self._wake.set()

    def apply(self, entry: OutboxEntry) -> None:
        patch = entry.patch
        if patch.target == "pod":
            self.kube.patch_pod_annotations(patch.namespace, patch.name, patch.annotations)
        else:
            self.kube.patch_node(patch.name, {"metadata": {"annotations": dict(patch.annotations)}})

    def run_once(self) -> int:
        """Apply every due entry once; returns how many are still pending afterwards."""
        for entry in self.ledger.due():
            if self._stop.is_set():
                break
            try:
                self.apply(entry)
            except ApiError as err:
                if err.status in PERMANENT:
                    log.warning("outbox patch dropped", target=entry.patch.name, error=str(err))
                    self.ledger.done([entry.id])
                else:
                    delay = min(BACKOFF_START_S * 2**entry.attempts, BACKOFF_MAX_S)
                    self.ledger.retry_later(entry.id, str(err), delay)
                continue
            self.ledger.done([entry.id])
        return self.ledger.outbox_size()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self.run_once()
            self._wake.wait(IDLE_WAIT_S)
