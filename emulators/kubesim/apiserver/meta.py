"""The JSON object type the emulator stores, and the metadata and time helpers every module shares."""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping
from typing import Any

#: A Kubernetes object (or any JSON object) as decoded from the wire.
Obj = dict[str, Any]

#: `metadata` maps the real server drops when empty (they are `omitempty` in ObjectMeta).
_OMIT_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences")


def meta(obj: Obj) -> Obj:
    """The object's metadata, created when missing (for objects being built or edited)."""
    value = obj.get("metadata")
    if not isinstance(value, dict):
        value = obj["metadata"] = {}
    return value


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def resource_version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def dig(obj: Mapping[str, Any], *path: str) -> Any:
    """The value at `path` (`dig(pod, "spec", "nodeName")`), None where any step is missing."""
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def text_at(obj: Mapping[str, Any], *path: str) -> str:
    """Like `dig`, as the string a field selector or a table cell compares: "" for missing."""
    value = dig(obj, *path)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def drop_nulls(value: Any) -> Any:
    """Drop JSON nulls from objects, recursively: Go decodes them to zero values and omits them."""
    if isinstance(value, dict):
        return {key: drop_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [drop_nulls(item) for item in value]
    return value


def tidy_metadata(obj: Obj) -> None:
    """Remove the empty metadata collections the real server never shows."""
    metadata = meta(obj)
    for key in _OMIT_WHEN_EMPTY:
        if key in metadata and not metadata[key]:
            del metadata[key]


def rfc3339(seconds: float) -> str:
    """A `metav1.Time` as JSON: second precision, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def parse_time(value: object) -> float | None:
    """Seconds since the epoch for an RFC 3339 timestamp (either precision); None if absent or bad."""
    if not isinstance(value, str) or not value.endswith("Z"):
        return None
    whole, _, fraction = value[:-1].partition(".")
    try:
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return seconds + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)
