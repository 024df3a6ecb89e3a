"""URL paths of the served group versions (`/api/v1/...`, `/apis/<group>/<version>/...`) mapped to
(kind, namespace, name, subresource)."""

from __future__ import annotations

from dataclasses import dataclass

from kubesim.apiserver import errors
from kubesim.apiserver.kinds import BY_PLURAL, Kind

BINDINGS = "bindings"


@dataclass(frozen=True)
class Route:
    kind: Kind | None  # None: the namespaced `bindings` collection (POST a Binding)
    namespace: str  # "" for cluster-scoped kinds and for lists across all namespaces
    name: str  # "" for collections
    subresource: str


def parse(path: str) -> Route:
    """Route for a resource path; 404 NotFound for anything the server does not serve."""
    parts = [part for part in path.split("/") if part]
    if parts[:2] == ["api", "v1"] and len(parts) >= 3:
        group, rest = ("", "v1"), parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = (parts[1], parts[2]), parts[3:]
    else:
        raise errors.unknown_path()
    legacy_watch = rest[0] == "watch" and not group[0]  # the deprecated /api/v1/watch/... form
    if legacy_watch:
        rest = rest[1:]
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and _namespaced_collection(group, rest[2]):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise errors.unknown_path()
    plural, name, subresource = [*rest, "", ""][:3]
    if plural == BINDINGS and not group[0]:
        if not namespace or name or legacy_watch:
            raise errors.unknown_path()
        return Route(None, namespace, "", "")
    kind = _kind(group, plural)
    if kind is None or (namespace and not kind.namespaced):
        raise errors.unknown_path()
    if kind.namespaced and not namespace and name:
        raise errors.unknown_path()  # a namespaced object is only addressed inside its namespace
    if subresource and (subresource not in kind.subresources or legacy_watch):
        raise errors.unknown_path()
    return Route(kind, namespace, name, subresource)


def _kind(group: tuple[str, str], plural: str) -> Kind | None:
    kind = BY_PLURAL.get(plural)
    return kind if kind is not None and (kind.group, kind.version) == group else None


def _namespaced_collection(group: tuple[str, str], plural: str) -> bool:
    kind = _kind(group, plural)
    return (plural == BINDINGS and not group[0]) or (kind is not None and kind.namespaced)
