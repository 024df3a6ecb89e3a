"""The API itself, transport aside: a request in, a JSON reply or a watch stream out.

Routing, query parameters, body decoding, content negotiation (JSON or server-side-printed Table) and
the verbs; the semantics of each write live in the store.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from deviceplugin.logs import get_log
from kubesim.apiserver import discovery, errors, routes, tables
from kubesim.apiserver.errors import ApiError
from kubesim.apiserver.jsonpatch import apply_json_patch
from kubesim.apiserver.kinds import Kind
from kubesim.apiserver.mergepatch import merge_patch, strategic_merge_patch
from kubesim.apiserver.meta import Obj, dig, labels_of, name_of, namespace_of, resource_version_of
from kubesim.apiserver.selectors import FieldSelector, LabelSelector
from kubesim.apiserver.store import DeleteOptions, Store
from kubesim.apiserver.watch import Bookmark, StreamOptions, stream

log = get_log(__name__)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH)
# Without timeoutSeconds the real server ends a watch after a random time in [1, 2) x 30 minutes.
_DEFAULT_WATCH_TIMEOUT_S = (1800.0, 3600.0)
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_TRUE = ("1", "t", "T", "true", "TRUE", "True")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    accept: str = ""
    content_type: str = ""
    body: bytes = b""


@dataclass(frozen=True)
class Reply:
    code: int
    body: Obj | str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Stream:
    """A watch (200, chunked): events to send, None when idle (a chance to check the client is there)."""

    events: Iterator[Obj | None]


@dataclass(frozen=True)
class _Format:
    table: str  # "" for plain JSON, else the meta.k8s.io version of the Table asked for
    include: tables.IncludeObject


class Api:
    def __init__(
        self, store: Store, *, bookmark_interval_s: float, server_address: Callable[[], str]
    ) -> None:
        self._store = store
        self._bookmark_interval_s = bookmark_interval_s
        self._server_address = server_address

    def handle(self, request: Request) -> Reply | Stream:
        try:
            return self._dispatch(request)
        except ApiError as error:
            return Reply(error.code, error.status(), error.headers)
        except (
            Exception
        ) as failure:  # what the emulator cannot digest is a 500, as a panic is on the real one
            log.error(
                "request failed", method=request.method, path=request.path, error=traceback.format_exc()
            )
            internal = errors.internal(repr(failure))
            return Reply(internal.code, internal.status())

    # ------------------------------------------------------------------ routing

    def _dispatch(self, request: Request) -> Reply | Stream:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return Reply(200, "ok")
        documents: dict[str, Callable[[], Obj]] = {
            "/version": discovery.version,
            "/api": lambda: discovery.api_versions(self._server_address()),
            "/apis": discovery.api_groups,
            "/openapi/v3": discovery.openapi_v3_index,
        }
        document = documents.get(path) or discovery.group_version_document(path)
        if document is not None:
            if request.method != "GET":
                raise errors.method_not_allowed()
            return Reply(200, document())
        route = routes.parse(path)
        if route.kind is None:
            if request.method != "POST":
                raise errors.method_not_allowed()
            return self._bind(route.namespace, "", request)
        return self._resource(route.kind, route, request)

    def _resource(self, kind: Kind, route: routes.Route, request: Request) -> Reply | Stream:
        method = request.method
        if route.subresource == "binding":
            if method != "POST":
                raise errors.method_not_allowed()
            return self._bind(route.namespace, route.name, request)
        if kind.namespaced and not route.namespace and method != "GET":
            raise errors.method_not_allowed()  # across namespaces there is only list and watch
        if is_watch(request.path, request.query):
            if method != "GET":
                raise errors.method_not_allowed()
            return self._watch(kind, route, request)
        if not route.name:
            handlers: dict[str, Callable[[Kind, routes.Route, Request], Reply | Stream]] = {
                "GET": self._list,
                "POST": self._create,
                "DELETE": self._delete_collection,
            }
        elif route.subresource:
            handlers = {"GET": self._get, "PUT": self._update, "PATCH": self._patch}
        else:
            handlers = {"GET": self._get, "PUT": self._update, "PATCH": self._patch, "DELETE": self._delete}
        handler = handlers.get(method)
        if handler is None:
            raise errors.method_not_allowed()
        return handler(kind, route, request)

    # ------------------------------------------------------------------ reads

    def _get(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        obj = self._store.get(kind, route.namespace, route.name)
        return Reply(200, self._one(kind, obj, _format(request)))

    def _list(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        matches = _matcher(kind, request.query, route.name)
        wanted_rv = request.query.get("resourceVersion", "")
        items, rv = self._store.list(kind, route.namespace, matches)
        if wanted_rv not in ("", "0") and _version(wanted_rv) > rv:
            raise errors.too_large_resource_version(_version(wanted_rv), rv)
        page, list_meta = _paginate(items, rv, request.query)
        fmt = _format(request)
        if fmt.table:
            return Reply(
                200, tables.table(kind, page, metadata=list_meta, include=fmt.include, version=fmt.table)
            )
        body = {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": list_meta,
            # List items carry no kind/apiVersion on the wire; the list says what they are.
            "items": [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in page],
        }
        return Reply(200, body)

    def _watch(self, kind: Kind, route: routes.Route, request: Request) -> Stream:
        query = request.query
        matches = _matcher(kind, query, route.name)
        fmt = _format(request)
        initial = _flag(query, "sendInitialEvents")
        since_text = query.get("resourceVersion", "")
        since = None if initial or since_text in ("", "0") else _version(since_text)
        try:
            feed = self._store.watch(kind, route.namespace, since, initial_events_end=initial)
        except ApiError as error:
            # Past the request checks, the real server reports watch errors as an ERROR event.
            return Stream(iter([{"type": "ERROR", "object": error.status()}]))
        timeout_text = query.get("timeoutSeconds")
        timeout_s = (
            _integer(timeout_text, "timeoutSeconds")
            if timeout_text
            else random.uniform(*_DEFAULT_WATCH_TIMEOUT_S)
        )
        bookmarks = self._bookmark_interval_s if _flag(query, "allowWatchBookmarks") else None

        def render(event_type: str, item: Obj | Bookmark) -> Obj:
            if isinstance(item, Bookmark):
                metadata: Obj = {"resourceVersion": str(item.rv)}
                if item.initial_events_end:
                    metadata["annotations"] = {_INITIAL_EVENTS_END: "true"}
                obj: Obj = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": metadata}
                if fmt.table:
                    obj = tables.table(kind, [], metadata=metadata, include=fmt.include, version=fmt.table)
                return {"type": event_type, "object": obj}
            return {"type": event_type, "object": self._one(kind, item, fmt)}

        options = StreamOptions(timeout_s=timeout_s, bookmark_interval_s=bookmarks)
        return Stream(stream(feed, matches, render, options, self._store.bookmark))

    # ------------------------------------------------------------------ writes

    def _create(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        obj = self._store.create(kind, route.namespace, _object_body(request), dry_run=_dry_run(request))
        return Reply(201, self._one(kind, obj, _format(request)))

    def _update(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        obj, created = self._store.update(
            kind,
            route.namespace,
            route.name,
            _object_body(request),
            subresource=route.subresource,
            dry_run=_dry_run(request),
        )
        return Reply(201 if created else 200, self._one(kind, obj, _format(request)))

    def _patch(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        patch_type = request.content_type.split(";")[0].strip().lower()
        if patch_type not in _PATCH_TYPES:
            raise errors.unsupported_media_type(request.content_type, _PATCH_TYPES)
        document = _decode(request.body, yaml_ok=patch_type == APPLY_PATCH)
        apply, create = _patch_functions(kind, patch_type, document, request.query)
        obj, created = self._store.patch(
            kind,
            route.namespace,
            route.name,
            apply,
            subresource=route.subresource,
            dry_run=_dry_run(request),
            create=create,
        )
        return Reply(201 if created else 200, self._one(kind, obj, _format(request)))

    def _delete(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        obj = self._store.delete(
            kind, route.namespace, route.name, _delete_options(request), dry_run=_dry_run(request)
        )
        still_there = dig(obj, "metadata", "deletionTimestamp") is not None
        if kind.returns_deleted or still_there:
            return Reply(200, self._one(kind, obj, _format(request)))
        details = {"name": name_of(obj), "kind": kind.plural, "uid": dig(obj, "metadata", "uid")}
        return Reply(200, _success(details=details))

    def _delete_collection(self, kind: Kind, route: routes.Route, request: Request) -> Reply:
        items, rv = self._store.list(kind, route.namespace, _matcher(kind, request.query, ""))
        options = _delete_options(request)
        deleted: list[Obj] = []
        for obj in items:
            try:
                deleted.append(
                    self._store.delete(
                        kind,
                        namespace_of(obj),
                        name_of(obj),
                        options,
                        dry_run=_dry_run(request),
                    )
                )
            except ApiError as error:
                if error.code != 404:  # gone meanwhile is fine, like the real server
                    raise
        return Reply(
            200,
            {
                "kind": kind.list_kind,
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(rv)},
                "items": deleted,
            },
        )

    def _bind(self, namespace: str, name: str, request: Request) -> Reply:
        binding = _object_body(request)
        bound_name = name_of(binding)
        if name and bound_name and bound_name != name:
            raise errors.bad_request("name in URL does not match name in Binding object")
        annotations = dig(binding, "metadata", "annotations") or {}
        node = _binding_target(binding)
        self._store.bind(
            namespace,
            name or bound_name,
            node,
            {str(k): str(v) for k, v in annotations.items()},
            uid=dig(binding, "metadata", "uid") or None,
            resource_version=dig(binding, "metadata", "resourceVersion") or None,
        )
        return Reply(201, _success(code=201))

    # ------------------------------------------------------------------ rendering

    @staticmethod
    def _one(kind: Kind, obj: Obj, fmt: _Format) -> Obj:
        if fmt.table:
            metadata = {"resourceVersion": resource_version_of(obj)}
            return tables.table(kind, [obj], metadata=metadata, include=fmt.include, version=fmt.table)
        return obj


# --------------------------------------------------------------------------- request parsing


def is_watch(path: str, query: Mapping[str, str]) -> bool:
    return path.startswith("/api/v1/watch/") or _flag(query, "watch")


def _flag(query: Mapping[str, str], key: str) -> bool:
    return query.get(key, "") in _TRUE


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.bad_request(f'invalid value "{text}" for {what}') from None


def _version(text: str) -> int:
    if not text.isdigit():
        raise errors.bad_request(f'invalid resource version "{text}"') from None
    return int(text)


def _dry_run(request: Request) -> bool:
    value = request.query.get("dryRun", "")
    if value not in ("", "All"):
        raise errors.bad_request(f'unsupported dryRun value "{value}"; only "All" is allowed')
    return value == "All"


def _decode(body: bytes, *, yaml_ok: bool) -> Any:
    try:
        return yaml.safe_load(body) if yaml_ok else json.loads(body)
    except (ValueError, yaml.YAMLError) as error:
        raise errors.bad_request(f"error decoding request body: {error}") from None


def _object_body(request: Request) -> Obj:
    if "protobuf" in request.content_type:
        # kubectl's typed commands (`create namespace`, `run`) send protobuf; manifests go as JSON.
        raise errors.unsupported_media_type(
            request.content_type, ("application/json", "application/yaml (use kubectl create -f / apply -f)")
        )
    yaml_body = "yaml" in request.content_type
    document = _decode(request.body, yaml_ok=yaml_body)
    if not isinstance(document, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return document


def _patch_functions(
    kind: Kind, patch_type: str, document: Any, query: Mapping[str, str]
) -> tuple[Callable[[Obj], Obj], Callable[[], Obj] | None]:
    """How to patch the live object and, for server-side apply, what to create when it is missing."""
    if patch_type == JSON_PATCH:
        return lambda current: apply_json_patch(current, document), None
    if not isinstance(document, dict):
        raise errors.bad_request(f"the patch must be a JSON object, not {type(document).__name__}")
    patch: Obj = document
    if patch_type == MERGE_PATCH:
        return lambda current: merge_patch(current, patch), None
    if patch_type == APPLY_PATCH:
        # Server-side apply, approximated: create when missing, else merge like a strategic patch.
        _check_apply(kind, patch, query)
        return lambda current: strategic_merge_patch(current, patch, kind.merge_keys), lambda: patch
    return lambda current: strategic_merge_patch(current, patch, kind.merge_keys), None


def _success(*, details: Obj | None = None, code: int | None = None) -> Obj:
    status: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        status["details"] = details
    if code is not None:
        status["code"] = code
    return status


def _binding_target(binding: Obj) -> str:
    """The node a Binding names; its checks fail as unclassified 500s, since the registry returns them raw."""
    target = binding.get("target") or {}
    problems = []
    if target.get("kind") not in (None, "", "Node"):
        problems.append(
            f'target.kind: Unsupported value: {json.dumps(target["kind"])}: supported values: "Node"'
        )
    if not target.get("name"):
        problems.append("target.name: Required value")
    if problems:
        raise ApiError(500, "", problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]")
    return str(target["name"])


def _check_apply(kind: Kind, patch: Obj, query: Mapping[str, str]) -> None:
    if not query.get("fieldManager"):
        cause = errors.FieldCause(
            "FieldValueRequired", "fieldManager", "Required value: is required for apply patch"
        )
        raise errors.invalid("PatchOptions.meta.k8s.io", "", [cause])
    if patch.get("kind") != kind.kind or patch.get("apiVersion") != kind.api_version:
        raise errors.bad_request(
            f"apply patches must name apiVersion {kind.api_version} and kind {kind.kind}"
        )


def _delete_options(request: Request) -> DeleteOptions:
    body = _decode(request.body, yaml_ok=False) if request.body.strip() else {}
    if not isinstance(body, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    grace = request.query.get("gracePeriodSeconds")
    grace_s = _integer(grace, "gracePeriodSeconds") if grace else body.get("gracePeriodSeconds")
    preconditions = body.get("preconditions") or {}
    return DeleteOptions(
        grace_period_s=None if grace_s is None else int(grace_s),
        uid=preconditions.get("uid"),
        resource_version=preconditions.get("resourceVersion"),
    )


def _matcher(kind: Kind, query: Mapping[str, str], name: str) -> Callable[[Obj], bool]:
    labels = LabelSelector(query.get("labelSelector", ""))
    fields = FieldSelector(query.get("fieldSelector", ""), kind.fields)
    if name:  # the legacy /watch/.../name form watches one object
        named = FieldSelector(f"metadata.name={name}", kind.fields)
        return lambda obj: named.matches(obj) and fields.matches(obj) and labels.matches(labels_of(obj))
    return lambda obj: fields.matches(obj) and labels.matches(labels_of(obj))


def _format(request: Request) -> _Format:
    """JSON, or a Table when the client asks for one (kubectl get does)."""
    for entry in request.accept.split(","):
        params = dict(part.strip().partition("=")[::2] for part in entry.split(";")[1:])
        if (
            params.get("as") == "Table"
            and params.get("g") == "meta.k8s.io"
            and params.get("v") in ("v1", "v1beta1")
        ):
            return _Format(params["v"], _include(request))
    return _Format("", "Metadata")


_INCLUDE: dict[str, tables.IncludeObject] = {"None": "None", "Metadata": "Metadata", "Object": "Object"}


def _include(request: Request) -> tables.IncludeObject:
    value = request.query.get("includeObject", "Metadata")
    if value not in _INCLUDE:
        raise errors.bad_request(f'unsupported includeObject "{value}"')
    return _INCLUDE[value]


def _paginate(items: list[Obj], rv: int, query: Mapping[str, str]) -> tuple[list[Obj], Obj]:
    """`limit`/`continue`: pages in key order. A continued list reads the current state after the
    last key (the real server reads a snapshot at the first page's version; etcd keeps history)."""
    list_rv = rv
    token = query.get("continue", "")
    if token:
        try:
            state = json.loads(base64.urlsafe_b64decode(token.encode()))
            list_rv, start = int(state["rv"]), (str(state["start"][0]), str(state["start"][1]))
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise errors.bad_request(f"continue key is not valid: {token}") from None
        items = [obj for obj in items if _key(obj) > start]
    limit_text = query.get("limit", "")
    limit = _integer(limit_text, "limit") if limit_text else 0
    list_meta: Obj = {"resourceVersion": str(list_rv)}
    if 0 < limit < len(items):
        state = {"v": "meta.k8s.io/v1", "rv": list_rv, "start": _key(items[limit - 1])}
        list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
        list_meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    return items, list_meta


def _key(obj: Obj) -> tuple[str, str]:
    return (str(obj["metadata"].get("namespace", "")), str(obj["metadata"]["name"]))
