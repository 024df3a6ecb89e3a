"""The object store: one lock, one resourceVersion counter, the watch history, the open watch feeds.

Write semantics follow the real registry (k8s.io/apiserver's generic store and the core strategies):
system metadata set by the server, optimistic concurrency on `metadata.resourceVersion`, status and
main resource updated separately, no-op updates leave the object (and its version) alone, graceful
and finalizer-held deletion, atomic pod binding. Stored objects are never mutated once committed, so
readers may hold them without copying.
"""

from __future__ import annotations

import copy
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from deviceplugin.logs import get_log
from kubesim.apiserver import errors
from kubesim.apiserver.kinds import KINDS, NAMESPACES, PODS, Kind
from kubesim.apiserver.meta import (
    Obj,
    dig,
    drop_nulls,
    meta,
    name_of,
    namespace_of,
    resource_version_of,
    rfc3339,
    tidy_metadata,
)
from kubesim.apiserver.times import encode_times
from kubesim.apiserver.validation import validate_name
from kubesim.apiserver.watch import Bookmark, Change, EventType, WatchFeed

log = get_log(__name__)

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_UNDELETABLE_NAMESPACES = ("default", "kube-system", "kube-public")
# utilrand.String's alphabet: no vowels, no look-alike digits.
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Server-set metadata an update cannot change.
_SYSTEM_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds


@dataclass(frozen=True)
class DeleteOptions:
    grace_period_s: int | None = None
    uid: str | None = None
    resource_version: str | None = None


class Store:
    def __init__(
        self,
        *,
        watch_history: int,
        graceful_pod_deletion: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self._graceful_pods = graceful_pod_deletion
        self._rv = 0
        self._objects: dict[str, dict[Key, Obj]] = {kind.plural: {} for kind in KINDS}
        self._history: deque[Change] = deque()
        self._history_limit = watch_history
        self._floor = 0  # changes at or below this version are forgotten
        self._feeds: set[WatchFeed] = set()
        self._watches_closed = False
        for name in INITIAL_NAMESPACES:
            self.create(NAMESPACES, "", {"metadata": {"name": name}})

    # ------------------------------------------------------------------ reads

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def get(self, kind: Kind, namespace: str, name: str) -> Obj:
        with self._lock:
            obj = self._objects[kind.plural].get((namespace, name))
        if obj is None:
            raise errors.not_found(kind.plural, name)
        return obj

    def list(self, kind: Kind, namespace: str, matches: Callable[[Obj], bool]) -> tuple[list[Obj], int]:
        """Matching objects in key order (namespace, name), and the version the list is at."""
        with self._lock:
            items = [obj for key, obj in sorted(self._objects[kind.plural].items()) if _in(key, namespace)]
            rv = self._rv
        return [obj for obj in items if matches(obj)], rv

    # ------------------------------------------------------------------ create

    def create(self, kind: Kind, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        obj = _normalized(kind, body)
        metadata = meta(obj)
        if metadata.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        if kind.namespaced:
            if metadata.get("namespace") and metadata["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            metadata.pop(key, None)
        kind.defaults(obj)
        kind.prepare_create(obj)
        with self._lock:
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = self._generated_name(kind, namespace, str(metadata["generateName"]))
            causes = validate_name(obj, kind.label_names) + kind.validate(obj)
            if causes:
                raise errors.invalid(kind.kind, name_of(obj), causes)
            if kind.namespaced and (namespace_key := ("", namespace)) not in self._objects[NAMESPACES.plural]:
                raise errors.not_found(NAMESPACES.plural, namespace_key[1])
            if (namespace, name_of(obj)) in self._objects[kind.plural]:
                raise errors.already_exists(kind.plural, name_of(obj))
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = rfc3339(self._clock())
            tidy_metadata(obj)
            return obj if dry_run else self._commit(kind, "ADDED", obj, None)

    def _generated_name(self, kind: Kind, namespace: str, prefix: str) -> str:
        prefix = prefix[:58]  # room for the suffix within 63 characters
        while True:
            name = prefix + "".join(random.choices(_NAME_SUFFIX_ALPHABET, k=5))
            if (namespace, name) not in self._objects[kind.plural]:
                return name

    # ------------------------------------------------------------------ update and patch

    def update(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        body: Obj,
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """PUT. Returns the stored object and whether it was created (kinds that allow create-on-update)."""
        _check_body_identity(kind, namespace, name, body)
        with self._lock:
            old = self._objects[kind.plural].get((namespace, name))
            if old is None:
                if kind.create_on_update and not subresource:
                    return self.create(kind, namespace, body, dry_run=dry_run), True
                raise errors.not_found(kind.plural, name)
            return self._replace(kind, old, body, subresource, dry_run), False

    def patch(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        apply: Callable[[Obj], Obj],
        *,
        subresource: str = "",
        dry_run: bool = False,
        create: Callable[[], Obj] | None = None,
    ) -> tuple[Obj, bool]:
        """PATCH: `apply` maps a copy of the live object to the patched one, under the store lock.

        With `create` (server-side apply), a missing object is created from what it returns.
        """
        with self._lock:
            old = self._objects[kind.plural].get((namespace, name))
            if old is None:
                if create is None or subresource:
                    raise errors.not_found(kind.plural, name)
                return self.create(kind, namespace, create(), dry_run=dry_run), True
            patched = apply(copy.deepcopy(old))
            if not isinstance(patched, dict):
                raise errors.bad_request("the patch did not produce an object")
            _check_body_identity(kind, namespace, name, patched)
            return self._replace(kind, old, patched, subresource, dry_run), False

    def _replace(self, kind: Kind, old: Obj, body: Obj, subresource: str, dry_run: bool) -> Obj:
        new = _normalized(kind, body)
        name = name_of(old)
        wanted = resource_version_of(new)
        if wanted and wanted != resource_version_of(old):
            raise errors.stale(kind.plural, name)
        metadata = meta(new)
        for key in _SYSTEM_METADATA:
            if key in old["metadata"]:
                metadata[key] = old["metadata"][key]
            else:
                metadata.pop(key, None)
        if kind.namespaced:
            metadata["namespace"] = namespace_of(old)
        if kind.has_status and subresource == "status":
            # The status endpoint changes status (and metadata) only.
            _keep(new, old, "spec")
            if kind is PODS:
                _keep(metadata, old["metadata"], "ownerReferences")
        elif kind.has_status:
            _keep(new, old, "status")
        kind.defaults(new)
        causes = kind.validate(new) + kind.validate_update(new, old)
        if causes:
            raise errors.invalid(kind.kind, name, causes)
        tidy_metadata(new)
        metadata["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old  # the real server writes nothing, and the version does not move
        if dry_run:
            return new
        if _finalized(new, old):
            return self._remove(kind, new)
        return self._commit(kind, "MODIFIED", new, old)

    # ------------------------------------------------------------------ delete

    def delete(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        options: DeleteOptions,
        *,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE; returns the object's state after the call (terminating, or the last one stored)."""
        with self._lock:
            old = self.get(kind, namespace, name)
            self._check_preconditions(kind, old, options.uid, options.resource_version)
            if kind is NAMESPACES and name in _UNDELETABLE_NAMESPACES:
                raise errors.forbidden(kind.plural, name, "this namespace may not be deleted")
            if dry_run:
                return old
            grace = self._grace_period(kind, old, options)
            if grace > 0:
                current = dig(old, "metadata", "deletionGracePeriodSeconds")
                if current is not None and current <= grace:
                    return old
                return self._mark_deleting(kind, old, grace)
            if dig(old, "metadata", "finalizers"):
                if dig(old, "metadata", "deletionGracePeriodSeconds") == 0:
                    return old
                return self._mark_deleting(kind, old, 0)
            if kind is NAMESPACES:
                return self._delete_namespace(old)
            self._remove(kind, old)
            return old

    def finish_deletion(self, kind: Kind, namespace: str, name: str) -> Obj:
        """What kubelet does once a pod's containers are gone: delete it with grace period 0."""
        return self.delete(kind, namespace, name, DeleteOptions(grace_period_s=0))

    def _check_preconditions(
        self, kind: Kind, obj: Obj, uid: str | None, resource_version: str | None
    ) -> None:
        """A delete's or a Binding's preconditions: the object it meant, at the version it saw."""
        for label, wanted, actual in (
            ("UID", uid, dig(obj, "metadata", "uid")),
            ("ResourceVersion", resource_version, resource_version_of(obj)),
        ):
            if wanted is not None and wanted != actual:
                why = f"Precondition failed: {label} in precondition: {wanted}, "
                why += f"{label} in object meta: {actual}"
                raise errors.conflict(kind.plural, name_of(obj), why)

    def _grace_period(self, kind: Kind, obj: Obj, options: DeleteOptions) -> int:
        if kind is not PODS or not self._graceful_pods:
            return 0
        if not dig(obj, "spec", "nodeName") or dig(obj, "status", "phase") in ("Succeeded", "Failed"):
            return 0  # never started or already finished: nothing to wait for
        if options.grace_period_s is not None:
            return max(options.grace_period_s, 0)
        return int(dig(obj, "spec", "terminationGracePeriodSeconds") or 0)

    def _mark_deleting(self, kind: Kind, old: Obj, grace: int) -> Obj:
        new = copy.deepcopy(old)
        metadata = meta(new)
        if grace > 0 or "deletionTimestamp" not in metadata:
            metadata["deletionTimestamp"] = rfc3339(self._clock() + grace)
        metadata["deletionGracePeriodSeconds"] = grace
        return self._commit(kind, "MODIFIED", new, old)

    def _delete_namespace(self, namespace: Obj) -> Obj:
        """Terminating, then its content goes, then it goes: the namespace controller's work, at once."""
        terminating = copy.deepcopy(namespace)
        meta(terminating)["deletionTimestamp"] = rfc3339(self._clock())
        meta(terminating)["deletionGracePeriodSeconds"] = 0
        terminating["status"] = {"phase": "Terminating"}
        terminating = self._commit(NAMESPACES, "MODIFIED", terminating, namespace)
        for kind in KINDS:
            if kind.namespaced:
                for key, obj in sorted(self._objects[kind.plural].items()):
                    if key[0] == name_of(namespace):
                        self._remove(kind, obj)
        self._remove(NAMESPACES, terminating)
        return terminating

    def _remove(self, kind: Kind, obj: Obj) -> Obj:
        return self._commit(kind, "DELETED", obj, obj)

    # ------------------------------------------------------------------ binding

    def bind(
        self,
        namespace: str,
        name: str,
        node: str,
        annotations: dict[str, str],
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """Assign a pod to a node: nodeName, annotations and PodScheduled in one write. The Binding's
        UID and resourceVersion, when given, are preconditions: a pod deleted and made again under
        its name is not bound by a Binding meant for the one before."""
        with self._lock:
            old = self.get(PODS, namespace, name)
            self._check_preconditions(PODS, old, uid, resource_version)
            why = ""
            if dig(old, "metadata", "deletionTimestamp"):
                why = f"pod {name} is being deleted, cannot be assigned to a host"
            elif dig(old, "spec", "nodeName"):
                why = f'pod {name} is already assigned to node "{old["spec"]["nodeName"]}"'
            elif dig(old, "spec", "schedulingGates"):
                why = f"pod {name} has non-empty .spec.schedulingGates"
            if why:
                raise errors.conflict("pods/binding", name, why)
            new = copy.deepcopy(old)
            new["spec"]["nodeName"] = node
            meta(new).setdefault("annotations", {}).update(annotations)
            tidy_metadata(new)
            _set_condition(new, {"type": "PodScheduled", "status": "True"}, rfc3339(self._clock()))
            return self._commit(PODS, "MODIFIED", new, old)

    # ------------------------------------------------------------------ watch

    def watch(
        self, kind: Kind, namespace: str, since: int | None, *, initial_events_end: bool = False
    ) -> WatchFeed:
        """Open a feed. `since=None` starts with an ADDED per current object; otherwise every change
        after `since` is replayed from history, or 410 Expired when history no longer reaches back."""
        with self._lock:
            feed = WatchFeed(kind, namespace, self._unwatch)
            if since is None:
                for key, obj in sorted(self._objects[kind.plural].items()):
                    if _in(key, namespace):
                        feed.put(Change(int(resource_version_of(obj)), "ADDED", kind, obj, None))
                if initial_events_end:
                    feed.put(Bookmark(self._rv, initial_events_end=True))
            else:
                if since < self._floor:
                    raise errors.expired(f"too old resource version: {since} ({self._floor})")
                for change in self._history:
                    if change.rv > since:
                        feed.offer(change)
            if self._watches_closed:
                feed.put("stop")
            self._feeds.add(feed)
            return feed

    def bookmark(self, feed: WatchFeed) -> None:
        with self._lock:
            feed.put(Bookmark(self._rv))

    def _unwatch(self, feed: WatchFeed) -> None:
        with self._lock:
            self._feeds.discard(feed)

    def end_watches(self, how: str) -> int:
        """End every open watch, cleanly ("stop") or by cutting it ("drop"); returns how many."""
        with self._lock:
            feeds = list(self._feeds)
        for feed in feeds:
            feed.put("drop" if how == "drop" else "stop")
        return len(feeds)

    def close_watches(self) -> None:
        """End every watch, and every one opened from now on (the server is stopping)."""
        with self._lock:
            self._watches_closed = True
        self.end_watches("stop")

    def compact(self) -> None:
        """Forget the watch history: any older resourceVersion now gets 410 Expired."""
        with self._lock:
            self._history.clear()
            self._floor = self._rv
            log.info("watch history compacted", resource_version=self._rv)

    # ------------------------------------------------------------------ commit

    def _commit(self, kind: Kind, event: EventType, obj: Obj, prev: Obj | None) -> Obj:
        self._rv += 1
        committed = dict(obj)
        committed["metadata"] = {**obj["metadata"], "resourceVersion": str(self._rv)}
        key = (namespace_of(committed), name_of(committed))
        if event == "DELETED":
            del self._objects[kind.plural][key]
        else:
            self._objects[kind.plural][key] = committed
        change = Change(self._rv, event, kind, committed, prev)
        if len(self._history) >= self._history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(change)
        for feed in self._feeds:
            feed.offer(change)
        return committed


def _in(key: Key, namespace: str) -> bool:
    return not namespace or key[0] == namespace


def _keep(new: Obj, old: Obj, key: str) -> None:
    if key in old:
        new[key] = copy.deepcopy(old[key])
    else:
        new.pop(key, None)


def _normalized(kind: Kind, body: Obj) -> Obj:
    """A deep copy of a request body as stored: kind and apiVersion first, nulls gone, times in UTC."""
    wrong_version = body.get("apiVersion") not in (None, "", kind.api_version)
    if body.get("kind") not in (None, "", kind.kind) or wrong_version:
        raise errors.bad_request(
            f"the object provided is unrecognized (must be of type {kind.kind}): "
            f"{body.get('apiVersion')}, Kind={body.get('kind')}"
        )
    cleaned = drop_nulls(copy.deepcopy(body))
    encode_times(cleaned, kind.kind)
    rest = {key: value for key, value in cleaned.items() if key not in ("kind", "apiVersion")}
    obj: Obj = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {}, **rest}
    if not isinstance(obj["metadata"], dict):
        raise errors.bad_request("metadata must be an object")
    return obj


def _check_body_identity(kind: Kind, namespace: str, name: str, body: Obj) -> None:
    body_name = name_of(body)
    if body_name != name:
        raise errors.bad_request(
            f"the name of the object ({body_name}) does not match the name on the URL ({name})"
        )
    body_namespace = namespace_of(body)
    if kind.namespaced and body_namespace and body_namespace != namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


def _finalized(new: Obj, old: Obj) -> bool:
    """An update that removes the last finalizer of an object waiting on finalizers deletes it."""
    return dig(old, "metadata", "deletionGracePeriodSeconds") == 0 and not dig(new, "metadata", "finalizers")


def _set_condition(obj: Obj, condition: Obj, now: str) -> None:
    conditions: list[Obj] = obj.setdefault("status", {}).setdefault("conditions", [])
    for index, existing in enumerate(conditions):
        if existing.get("type") == condition["type"]:
            moved = existing.get("status") != condition["status"]
            since = now if moved else existing.get("lastTransitionTime", now)
            conditions[index] = {**condition, "lastTransitionTime": since}
            return
    conditions.append({**condition, "lastTransitionTime": now})
