"""Watches: the change record every write produces, a per-watch queue, and the event stream.

The store offers each change to every open feed under its lock, so a feed sees changes in
resourceVersion order; the stream applies the watch's selectors the way the real watch cache does
(an object that stops matching is DELETED for that watcher, one that starts matching is ADDED).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kubesim.apiserver.meta import Obj, namespace_of

if TYPE_CHECKING:
    from kubesim.apiserver.kinds import Kind

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
#: How a feed is ended: "stop" finishes the response cleanly, "drop" cuts the connection.
Ending = Literal["stop", "drop"]
#: The longest a stream sleeps without giving its caller a chance to notice a vanished client.
IDLE_POLL_S = 0.5


@dataclass(frozen=True)
class Change:
    """One committed write. For DELETED, `obj` is the last state carrying the deletion's resourceVersion."""

    rv: int
    type: EventType
    kind: Kind
    obj: Obj
    prev: Obj | None


@dataclass(frozen=True)
class Bookmark:
    rv: int
    initial_events_end: bool = False


class WatchDropped(Exception):
    """The emulator was told to cut every watch connection."""


class WatchFeed:
    """The queue between the store (producer, under its lock) and one watch stream (consumer)."""

    def __init__(self, kind: Kind, namespace: str, on_close: Callable[[WatchFeed], None]) -> None:
        self.kind = kind
        self.namespace = namespace
        self._on_close = on_close
        self._queue: queue.SimpleQueue[Change | Bookmark | Ending] = queue.SimpleQueue()

    def offer(self, change: Change) -> None:
        if change.kind is self.kind and (not self.namespace or namespace_of(change.obj) == self.namespace):
            self._queue.put(change)

    def put(self, item: Change | Bookmark | Ending) -> None:
        self._queue.put(item)

    def next(self, timeout_s: float) -> Change | Bookmark | Ending | None:
        try:
            return self._queue.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        self._on_close(self)


def visible_event(change: Change, matches: Callable[[Obj], bool]) -> tuple[EventType, Obj] | None:
    """What a watcher with these selectors sees of a change, if anything."""
    now = matches(change.obj)
    if change.type != "MODIFIED":
        return (change.type, change.obj) if now else None
    was = change.prev is not None and matches(change.prev)
    if now:
        return ("MODIFIED" if was else "ADDED"), change.obj
    if was and change.prev is not None:
        # The watcher last saw the previous state; it leaves the selection at this change's version.
        gone = dict(change.prev)
        gone["metadata"] = {
            **change.prev["metadata"],
            "resourceVersion": change.obj["metadata"]["resourceVersion"],
        }
        return "DELETED", gone
    return None


@dataclass(frozen=True)
class StreamOptions:
    timeout_s: float | None
    bookmark_interval_s: float | None  # None: the client did not allow bookmarks


def stream(
    feed: WatchFeed,
    matches: Callable[[Obj], bool],
    render: Callable[[str, Obj | Bookmark], Obj],
    options: StreamOptions,
    request_bookmark: Callable[[WatchFeed], None],
) -> Iterator[Obj | None]:
    """Watch events as JSON-ready dicts until timeout or stop; None when idle (so the caller can
    check its client is still there). Raises WatchDropped when connections are to be cut."""
    started = time.monotonic()
    deadline = started + options.timeout_s if options.timeout_s is not None else None
    interval = options.bookmark_interval_s
    next_bookmark = started + interval if interval else None
    try:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if next_bookmark is not None and interval and now >= next_bookmark:
                request_bookmark(feed)  # queued behind every change already committed
                next_bookmark = now + interval
            wake = min(t for t in (deadline, next_bookmark, now + IDLE_POLL_S) if t is not None)
            item = feed.next(wake - now)
            if item is None:
                yield None
            elif item == "stop":
                return
            elif item == "drop":
                raise WatchDropped
            elif isinstance(item, Bookmark):
                yield render("BOOKMARK", item)
            elif isinstance(item, Change):
                event = visible_event(item, matches)
                if event is not None:
                    yield render(*event)
    finally:
        feed.close()
