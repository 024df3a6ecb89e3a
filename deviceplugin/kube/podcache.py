"""The pods bound to this node, kept current by list + watch (`spec.nodeName=<node>`).

One list, then a watch from its resourceVersion; a watch that ends is resumed from the last
version seen, a 410 (history expired) or a broken stream leads to a fresh list, and failures back
off exponentially. Readers get a consistent snapshot, can wait (bounded) for a condition to become
true, and can ask how stale the cache may be.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from deviceplugin.kube.api import ApiError, Kube, Obj, WatchStream
from deviceplugin.logs import get_log
from deviceplugin.worker import Worker

log = get_log(__name__)

WATCH_TIMEOUT_S = 300
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 10.0


def _uid(pod: Obj) -> str:
    return str(pod.get("metadata", {}).get("uid", ""))


def _version(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


class PodCache:
    def __init__(self, kube: Kube, node_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.node_name = node_name
        self.selector = f"spec.nodeName={node_name}"
        self._clock = clock
        self._pods: dict[str, Obj] = {}
        self._watching = False
        self._synced_once = False
        self._current_since: float | None = None  # when the cache last stopped being known current
        self._cond = threading.Condition()
        self._stream: WatchStream | None = None
        self._worker = Worker("pod-cache", self._run, interrupt=self._close_stream)
        self._listeners: list[Callable[[str, Obj], None]] = []

    # --- readers ------------------------------------------------------------------------------

    def pods(self) -> list[Obj]:
        with self._cond:
            return list(self._pods.values())

    def get(self, uid: str) -> Obj | None:
        with self._cond:
            return self._pods.get(uid)

    @property
    def synced(self) -> bool:
        """A list has completed and the watch that follows it is open."""
        with self._cond:
            return self._watching

    def staleness_s(self) -> float:
        """0 while the watch is open; else how long the cache may have been missing changes
        (since start when it never synced)."""
        with self._cond:
            if self._watching or self._current_since is None:
                return 0.0 if self._watching else float("inf")
            return self._clock() - self._current_since

    def wait_until(self, predicate: Callable[[PodCache], bool], timeout_s: float) -> bool:
        """Block until `predicate(self)` holds (re-checked on every change) or the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_synced(self, timeout_s: float) -> bool:
        return self.wait_until(lambda cache: cache._watching, timeout_s)

    def add_listener(self, listener: Callable[[str, Obj], None]) -> None:
        """Call `listener(kind, pod)` for every ADDED, MODIFIED and DELETED pod (a pod missing from
        a relist counts as DELETED), from the cache's thread, after the cache has changed and
        before `wait_until` waiters re-check."""
        self._listeners.append(listener)

    def _notify(self, kind: str, pod: Obj) -> None:
        for listener in self._listeners:
            listener(kind, pod)

    def _wake_waiters(self) -> None:
        # After the listeners: a waiter's predicate may read what a listener keeps.
        with self._cond:
            self._cond.notify_all()

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _close_stream(self) -> None:
        with self._cond:
            stream = self._stream
        if stream is not None:
            stream.close()

    # --- the loop -----------------------------------------------------------------------------

    def _set_watching(self, watching: bool) -> None:
        with self._cond:
            if watching == self._watching:
                return
            self._watching = watching
            if not watching:
                self._current_since = self._clock()
            self._cond.notify_all()

    def _replace(self, items: list[Obj]) -> None:
        mine = {_uid(pod): pod for pod in items if self._on_node(pod)}
        with self._cond:
            gone = [pod for uid, pod in self._pods.items() if uid not in mine]
            self._pods = mine
        for pod in gone:
            self._notify("DELETED", pod)
        for pod in mine.values():
            self._notify("MODIFIED", pod)
        self._wake_waiters()

    def _on_node(self, pod: Obj) -> bool:
        # The selector already filters; this guards against ever holding another node's pod.
        return bool(pod.get("spec", {}).get("nodeName") == self.node_name)

    def _apply(self, event: Obj) -> str:
        """Apply one watch event; returns the resourceVersion it carries."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise ApiError(code, str(obj.get("reason", "")), str(obj.get("message", "watch error")))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            uid = _uid(obj)
            present = kind != "DELETED" and self._on_node(obj)
            with self._cond:
                if present:
                    self._pods[uid] = obj
                else:
                    self._pods.pop(uid, None)
            self._notify(str(kind) if present else "DELETED", obj)
            self._wake_waiters()
        return _version(obj)

    def _watch(self, version: str) -> str:
        """Follow the watch until it ends; returns the last resourceVersion seen."""
        with self.kube.watch_pods(self.selector, version, WATCH_TIMEOUT_S) as stream:
            with self._cond:
                self._stream = stream
            self._set_watching(True)
            for event in stream:
                if self._worker.stopping.is_set():
                    break
                version = self._apply(event) or version
        return version

    def _run(self) -> None:
        backoff = BACKOFF_START_S
        while not self._worker.stopping.is_set():
            try:
                items, version = self.kube.list_pods(self.selector)
                self._replace(items)
                log.info("pod cache listed", node=self.node_name, pods=len(items), resource_version=version)
                backoff = BACKOFF_START_S
                while not self._worker.stopping.is_set():
                    version = self._watch(version)
            except ApiError as err:
                self._set_watching(False)
                if self._worker.stopping.is_set():
                    break
                if err.expired:
                    log.info("pod watch expired, listing again", error=str(err))
                    continue
                log.warning("pod cache lost the API server", error=str(err), retry_s=backoff)
                self._worker.stopping.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            finally:
                with self._cond:
                    self._stream = None
        self._set_watching(False)
