"""API objects a reader could not take: a malformed annotation, or a bug in the code reading it.

A cache and its listeners read every object the API server sends, and one bad object must cost
only itself: it is reported here and the caller goes on with the next. Each object is logged,
counted and passed to the hooks (the daemon posts a Warning Event on a pod that asks for its GPUs)
once, with the first reason found: it changes often, and several readers may fail on it, none of
which must repeat the line. The cache forgets an object when it is deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from deviceplugin.fit.errors import FitInputError
from deviceplugin.logs import describe_exception, get_log

log = get_log(__name__)

Obj = Mapping[str, Any]
Hook = Callable[[Obj, str], None]

MAX_REASON = 500  # a reason may quote the value, and values can be as large as 256 KiB


def describe(error: BaseException) -> str:
    """An input error's own message; any other exception is a bug: its type and where it was raised."""
    return str(error) if isinstance(error, FitInputError) else describe_exception(error)


def _metadata(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def display(obj: Obj) -> str:
    """`namespace/name` (a pod), `name` (a node); never raises, whatever the object's shape."""
    meta = _metadata(obj)
    name = str(meta.get("name") or meta.get("uid") or "?")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


class Rejections:
    """The objects of one kind ("pod", "node") that could not be read, and the hooks told of them."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._reported: set[str] = set()  # objects (UID, else name) reported and not deleted since
        self._count = 0
        self._hooks: list[Hook] = []

    @property
    def count(self) -> int:
        """Objects rejected since start, each counted once."""
        with self._lock:
            return self._count

    def add_hook(self, hook: Hook) -> None:
        """Call `hook(obj, reason)` for every object rejected, once, from the thread that reports it."""
        self._hooks.append(hook)

    def reject(self, obj: Obj, error: BaseException | str) -> None:
        key = self._key(obj)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
            self._count += 1
        reason = error if isinstance(error, str) else describe(error)
        if len(reason) > MAX_REASON:
            reason = reason[:MAX_REASON] + "..."
        log.warning(f"{self.kind} rejected", **{self.kind: display(obj)}, reason=reason)
        for hook in self._hooks:
            try:
                hook(obj, reason)
            except Exception as err:  # telling about one object must not stop the others either
                log.error("rejection not reported", **{self.kind: display(obj)}, error=describe(err))

    def forget(self, obj: Obj) -> None:
        """The object is gone: one of that identity seen later is reported afresh."""
        with self._lock:
            self._reported.discard(self._key(obj))

    @staticmethod
    def _key(obj: Obj) -> str:
        return str(_metadata(obj).get("uid") or display(obj))
