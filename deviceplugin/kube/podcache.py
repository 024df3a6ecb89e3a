"""API objects kept current by list + watch: the pods bound to this node (`spec.nodeName=<node>`),
every pod in the cluster, or every node (the scheduler extender's view).

`ListWatchCache` holds the loop for one kind and selector: one list, then a watch from its
resourceVersion; a watch that ends is resumed from the last version seen, a 410 (history expired)
or a broken stream leads to a fresh list, and API failures back off exponentially. Readers get a
consistent snapshot, can wait (bounded) for a condition to become true, and can ask how stale the
cache may be (`staleness_s`: how long since it was last known current).

A cache may keep less than the API serves: `slim(obj)` returns what to keep of each object (the
fields its readers use), applied to every listed and watched object before it is stored and before
a listener sees it; with hundreds of pods per node the rest (managedFields, images, probes, status
conditions) is most of the memory the objects hold.

No single object stops the loop: an object that cannot be keyed or slimmed, or that a listener
fails on (whatever it raises), is reported to `rejections` and the next one is processed. Anything else the
loop raises is a crash its worker's supervisor handles (logged, counted, restarted after a
back-off: see `deviceplugin.supervisor`); a restart lists afresh. The cache reads as not synced
from the crash until the new list and watch, and for good if its thread ever ends.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Self

from deviceplugin.backoff import Backoff, Retries
from deviceplugin.kube.api import ApiError, Kube, Obj, WatchStream
from deviceplugin.kube.rejections import Rejections
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

WATCH_TIMEOUT_S = 300
# Between lists while the API server fails: a cache per daemon on every node relisting in a tight
# loop would keep a recovering server down.
RELIST_RETRY = Backoff(start_s=0.2, max_s=10.0)


def _uid(pod: Obj) -> str:
    return str(pod.get("metadata", {}).get("uid", ""))


def _version(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


Lister = Callable[[], tuple[list[Obj], str]]
Watcher = Callable[[str, int], WatchStream]
Slim = Callable[[Obj], Obj]


class ListWatchCache:
    """Objects of one kind, keyed by `key(obj)`, kept current from `lister` + `watcher`; objects for
    which `keep(obj)` is false are treated as absent; `slim(obj)` (when given) is what is kept of
    each and what listeners are given. `keep` reads the object as served, `key` what is kept of
    it (a key taken from the served object would hold that object's memory: see
    `deviceplugin.plugin.podfields`)."""

    def __init__(
        self,
        what: str,
        lister: Lister,
        watcher: Watcher,
        *,
        key: Callable[[Obj], str] = _uid,
        keep: Callable[[Obj], bool] | None = None,
        slim: Slim | None = None,
        scope: str = "",
        clock: Callable[[], float] = time.monotonic,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._what = what  # "pod", "node": for thread names and logs
        self._scope = scope
        self._lister = lister
        self._watcher = watcher
        self._key = key
        self._keep = keep
        self._slim = slim
        self._clock = clock
        self._objects: dict[str, Obj] = {}
        self._watching = False
        self._synced_once = False
        self._current_at: float | None = None  # when the cache was last known current, if not now
        self._cond = threading.Condition()
        self._stream: WatchStream | None = None
        self._worker = Worker(f"{what}-cache", self._run, interrupt=self._close_stream, supervisor=supervisor)
        self._listeners: list[Callable[[str, Obj], None]] = []
        self.rejections = Rejections(what)

    # --- readers ------------------------------------------------------------------------------

    def objects(self) -> list[Obj]:
        with self._cond:
            return list(self._objects.values())

    def get(self, key: str) -> Obj | None:
        with self._cond:
            return self._objects.get(key)

    @property
    def synced(self) -> bool:
        """A list has completed and the watch that follows it is open."""
        with self._cond:
            return self._watching

    def staleness_s(self) -> float:
        """How long the cache may have been missing changes: 0 while its watch is open (however
        quiet), else the time since it was last known current: its last successful list, or the
        end of its last watch, whichever came later (infinite before the first list)."""
        with self._cond:
            if self._watching:
                return 0.0
            if self._current_at is None:
                return float("inf")
            return self._clock() - self._current_at

    def wait_until(self, predicate: Callable[[Self], bool], timeout_s: float) -> bool:
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
        """Call `listener(kind, obj)` for every ADDED, MODIFIED and DELETED object (one missing from
        a relist counts as DELETED; every one present in a relist as MODIFIED), from the cache's
        thread, after the cache has changed and before `wait_until` waiters re-check. Whatever a
        listener raises is reported to `rejections` against the object; the others still run."""
        self._listeners.append(listener)

    def _notify(self, kind: str, obj: Obj) -> None:
        for listener in self._listeners:
            try:
                listener(kind, obj)
            except Exception as err:  # one object a reader fails on must not stop the cache
                self.rejections.reject(obj, err)
        if kind == "DELETED":
            self.rejections.forget(obj)

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
                self._current_at = self._clock()
            self._cond.notify_all()

    def _place(self, obj: Obj) -> tuple[str, bool, Obj] | None:
        """The object's key, whether it is kept and what is kept of it; None (reported) when it
        cannot be read."""
        try:
            slimmed = obj if self._slim is None else self._slim(obj)
            return self._key(slimmed), self._keep is None or self._keep(obj), slimmed
        except Exception as err:
            self.rejections.reject(obj, err)
            return None

    def _replace(self, items: list[Obj]) -> None:
        mine: dict[str, Obj] = {}
        for obj in items:
            where = self._place(obj)
            if where is not None and where[1]:
                mine[where[0]] = where[2]
        with self._cond:
            gone = [obj for key, obj in self._objects.items() if key not in mine]
            self._objects = mine
            self._current_at = self._clock()  # a list is a sync, whether or not a watch follows
        for obj in gone:
            self._notify("DELETED", obj)
        for obj in mine.values():
            self._notify("MODIFIED", obj)
        self._wake_waiters()

    def _apply(self, event: Obj) -> str:
        """Apply one watch event; returns the resourceVersion it carries."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise ApiError(code, str(obj.get("reason", "")), str(obj.get("message", "watch error")))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            where = self._place(obj)
            if where is None:
                return ""
            key, present, kept = where[0], kind != "DELETED" and where[1], where[2]
            with self._cond:
                if present:
                    self._objects[key] = kept
                else:
                    self._objects.pop(key, None)
            self._notify(str(kind) if present else "DELETED", kept)
            self._wake_waiters()
        return _version(obj)

    def _watch(self, version: str) -> str:
        """Follow the watch until it ends; returns the last resourceVersion seen."""
        with self._watcher(version, WATCH_TIMEOUT_S) as stream:
            with self._cond:
                self._stream = stream
            if self._worker.stopping.is_set():
                # A stop while the request was out found no stream to close: reading would wait
                # for the watch's first event.
                return version
            self._set_watching(True)
            self._worker.turn()  # listed and watching: the loop works
            for event in stream:
                if self._worker.stopping.is_set():
                    break
                version = self._apply(event) or version
        return version

    def _list(self) -> tuple[int, str]:
        """List and replace the cache's objects: how many were listed and the list's version. (The
        list as served is let go here, not held by the loop for as long as the watch lasts.)"""
        items, version = self._lister()
        self._replace(items)
        return len(items), version

    def _run(self) -> None:
        try:
            self._loop()
        finally:  # however the loop ends (a crash too), nobody may take the cache as current
            self._set_watching(False)

    def _loop(self) -> None:
        retries = Retries(RELIST_RETRY)
        while not self._worker.stopping.is_set():
            try:
                count, version = self._list()
                log.info(
                    f"{self._what} cache listed", scope=self._scope, count=count, resource_version=version
                )
                retries.succeeded()
                while not self._worker.stopping.is_set():
                    version = self._watch(version)
            except ApiError as err:
                self._set_watching(False)
                if self._worker.stopping.is_set():
                    break
                if err.expired:
                    log.info(f"{self._what} watch expired, listing again", error=str(err))
                    continue
                delay = retries.failed()
                log.warning(f"{self._what} cache lost the API server", error=str(err), retry_s=delay)
                self._worker.stopping.wait(delay)
            finally:
                with self._cond:
                    self._stream = None


def rejected_by_kind(caches: Iterable[ListWatchCache]) -> dict[str, int]:
    """Objects the caches could not read, by the kind of object each cache holds."""
    rejected: Counter[str] = Counter()
    for cache in caches:
        rejected[cache.rejections.kind] += cache.rejections.count
    return dict(rejected)


class PodCache(ListWatchCache):
    """Pods by UID: those bound to `node_name` (the daemon's view), or with `node_name=None` every
    pod in the cluster, pending ones included (the scheduler extender's view)."""

    def __init__(
        self,
        kube: Kube,
        node_name: str | None,
        clock: Callable[[], float] = time.monotonic,
        supervisor: Supervisor | None = None,
        slim: Slim | None = None,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.selector = f"spec.nodeName={node_name}" if node_name else ""
        super().__init__(
            "pod",
            lambda: kube.list_pods(self.selector),
            lambda version, timeout_s: kube.watch_pods(self.selector, version, timeout_s),
            keep=self._on_node if node_name else None,
            slim=slim,
            scope=node_name or "cluster",
            clock=clock,
            supervisor=supervisor,
        )

    def pods(self) -> list[Obj]:
        return self.objects()

    def _on_node(self, pod: Obj) -> bool:
        # The selector already filters; this guards against ever holding another node's pod.
        return bool(pod.get("spec", {}).get("nodeName") == self.node_name)


class NodeCache(ListWatchCache):
    """Every node, by name."""

    def __init__(
        self,
        kube: Kube,
        clock: Callable[[], float] = time.monotonic,
        supervisor: Supervisor | None = None,
        slim: Slim | None = None,
    ) -> None:
        self.kube = kube
        super().__init__(
            "node",
            lambda: kube.list_nodes_versioned(""),
            lambda version, timeout_s: kube.watch_nodes("", version, timeout_s),
            key=_name,
            slim=slim,
            scope="cluster",
            clock=clock,
            supervisor=supervisor,
        )

    def nodes(self) -> list[Obj]:
        return self.objects()
