"""JSON merge patch (RFC 7386) and Kubernetes strategic merge patch.

Strategic merge patch is a merge patch that knows, per list field, whether the list is replaced (the
default) or merged: merged lists of objects pair items up by a *patch merge key* (containers by
`name`, conditions by `type`); merged lists of scalars (finalizers) are unions. The directives it
honours are the ones clients send: `$patch: replace|delete|merge`, `$retainKeys`,
`$setElementOrder/<field>` and `$deleteFromPrimitiveList/<field>`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kubesim.apiserver.errors import bad_request
from kubesim.apiserver.meta import Obj

#: Dotted path of a merged list field -> its patch merge key ("" for a merged list of scalars).
MergeKeys = Mapping[str, str]

_SET_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Obj, patch: Obj, keys: MergeKeys) -> Obj:
    merged = _merge_map(target, patch, "", keys)
    if merged is None:
        raise bad_request("Unable to delete the whole object with a strategic merge patch")
    return merged


def _merge_map(original: Obj, patch: Obj, path: str, keys: MergeKeys) -> Obj | None:
    """The merged map, or None when the patch says `$patch: delete`."""
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return _merge_map({}, {k: v for k, v in patch.items() if k != "$patch"}, path, keys)
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive} in map: {patch}")
    result = copy.deepcopy(original)
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith(_SET_ORDER):
            continue
        if key.startswith(_DELETE_FROM):
            field = key[len(_DELETE_FROM) :]
            result[field] = [item for item in result.get(field) or [] if item not in value]
            continue
        child = f"{path}.{key}" if path else key
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            merged = _merge_map(current if isinstance(current, dict) else {}, value, child, keys)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and child in keys:
            current = result.get(key)
            result[key] = _merge_list(current if isinstance(current, list) else [], value, child, keys)
        else:
            result[key] = copy.deepcopy(value)
    for key, order in patch.items():
        if key.startswith(_SET_ORDER) and isinstance(result.get(key[len(_SET_ORDER) :]), list):
            field = key[len(_SET_ORDER) :]
            result[field] = _reorder(result[field], order, keys.get(f"{path}.{field}" if path else field, ""))
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {key: value for key, value in result.items() if key in retain}
    return result


def _merge_list(original: list[Any], patch: list[Any], path: str, keys: MergeKeys) -> list[Any]:
    merge_key = keys[path]
    if not merge_key:
        return original + [item for item in patch if item not in original]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        items = [item for item in patch if not (isinstance(item, dict) and item.get("$patch") == "replace")]
        return _merge_list([], items, path, keys)
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        at = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            result = [
                old for old in result if not (isinstance(old, dict) and old.get(merge_key) == item[merge_key])
            ]
            continue
        merged = _merge_map(result[at] if at is not None else {}, item, path, keys)
        if merged is None:
            continue
        if at is None:
            result.append(merged)
        else:
            result[at] = merged
    return result


def _reorder(items: list[Any], order: list[Any], merge_key: str) -> list[Any]:
    """`$setElementOrder`: items named in `order` first, in that order; the others keep theirs, after."""

    def identity(item: Any) -> Any:
        return item.get(merge_key) if merge_key and isinstance(item, dict) else item

    wanted = [identity(entry) for entry in order]
    listed = sorted(
        (item for item in items if identity(item) in wanted), key=lambda item: wanted.index(identity(item))
    )
    return listed + [item for item in items if identity(item) not in wanted]
