"""Readers for Kubernetes objects given as JSON-shaped dicts (camelCase keys, as the API serves).

They return empty values for absent fields and raise `PodFormatError` for fields of the wrong
shape, so a malformed object is reported rather than half-read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.fit import keys
from deviceplugin.fit.errors import PodFormatError

Obj = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = {}
_STR = {str}


def _mapping(parent: Obj, key: str, where: str) -> Obj:
    if not isinstance(parent, Mapping):
        raise PodFormatError(f"{where} must be an object, not {type(parent).__name__}")
    value = parent.get(key)
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise PodFormatError(f"{where}.{key} must be an object, not {type(value).__name__}")
    return value


def _strings(parent: Obj, key: str, where: str) -> Mapping[str, str]:
    """A map of string values (annotations, labels), as the API server guarantees: readers call
    string methods on the values. (JSON keys are strings already.)"""
    value = _mapping(parent, key, where)
    if not set(map(type, value.values())) <= _STR:  # the cheapest check: this runs in every fit
        raise PodFormatError(f"{where}.{key} values must be strings")
    return value


def metadata(obj: Obj) -> Obj:
    return _mapping(obj, "metadata", "object")


def annotations_of(obj: Obj) -> Mapping[str, str]:
    return _strings(metadata(obj), "annotations", "metadata")


def labels_of(obj: Obj) -> Mapping[str, str]:
    return _strings(metadata(obj), "labels", "metadata")


def uid(obj: Obj) -> str:
    return str(metadata(obj).get("uid") or "")


def namespaced_name(obj: Obj) -> str:
    meta = metadata(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def display_name(obj: Obj) -> str:
    """How messages name a pod: `namespace/name`, or the UID when nameless."""
    meta = metadata(obj)
    if meta.get("name"):
        return namespaced_name(obj)
    return f"uid {uid(obj)}" if uid(obj) else "<unnamed pod>"


def _containers(obj: Obj, key: str) -> Sequence[Obj]:
    spec = _mapping(obj, "spec", "pod")
    value = spec.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise PodFormatError(f"pod {display_name(obj)}: spec.{key} must be a list of objects")
    return value


def containers(pod: Obj) -> Sequence[Obj]:
    return _containers(pod, "containers")


def init_containers(pod: Obj) -> Sequence[Obj]:
    return _containers(pod, "initContainers")


def container_name(container: Obj) -> str:
    return str(container.get("name") or "")


def limits(container: Obj) -> Obj:
    return _mapping(_mapping(container, "resources", "container"), "limits", "resources")


def requests(container: Obj) -> Obj:
    return _mapping(_mapping(container, "resources", "container"), "requests", "resources")


def status_resources(node: Obj, section: str) -> Obj:
    """A node's `status.capacity` or `status.allocatable`."""
    return _mapping(_mapping(node, "status", "node"), section, "status")


def phase(pod: Obj) -> str:
    return str(_mapping(pod, "status", "pod").get("phase") or "")


def is_terminal(pod: Obj) -> bool:
    """Succeeded or Failed: the containers have stopped and hold no GPU."""
    return phase(pod) in ("Succeeded", "Failed")


def is_terminating(pod: Obj) -> bool:
    """Deletion requested while not terminal: the containers may still run on the GPU."""
    return bool(metadata(pod).get("deletionTimestamp")) and not is_terminal(pod)


def podgroup_key(pod: Obj) -> str:
    """`namespace/group` of the pod's pod group, or "" when it has none."""
    notes = annotations_of(pod)
    group = notes.get(keys.KUBE_GROUP_NAME) or notes.get(keys.VOLCANO_GROUP_NAME)
    if not group:
        return ""
    return f"{metadata(pod).get('namespace') or 'default'}/{group}"
