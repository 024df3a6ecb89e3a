"""Reading upstream (Go) configuration field by field, with the Go types' rules; every error names
the field's path in the file (`nodeconfig[0].devicesplitcount`)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

Setting = tuple[object, str]  # (value for a daemon option, where it came from)


class UpstreamError(ValueError):
    """An upstream file holds something this daemon cannot honour; the message names the field."""


@dataclass(frozen=True, slots=True)
class Reading:
    """What an upstream file asks of the daemon: option name -> setting, and notes to log about
    fields that need nothing from a node plugin (who reads them instead)."""

    settings: dict[str, Setting]
    notes: tuple[str, ...] = ()


def field_path(parent: str, name: object) -> str:
    if isinstance(name, int):
        return f"{parent}[{name}]"
    return f"{parent}.{name}" if parent else str(name)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def fields(value: object, where: str, known: Collection[str], *, fold_case: bool) -> dict[str, Any]:
    """The mapping at `where` keyed by its known field names (null counts as empty). Go's
    encoding/json, and sigs.k8s.io/yaml over it, match names regardless of case (`fold_case`);
    gopkg.in/yaml.v2 matches them exactly. Unlike Go, an unknown field is an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UpstreamError(f"{where or 'the file'}: must be a mapping, got {_kind(value)}")
    names = {(name.lower() if fold_case else name): name for name in known}
    found: dict[str, Any] = {}
    for key, item in value.items():
        name = names.get(str(key).lower() if fold_case else str(key))
        if name is None:
            raise UpstreamError(
                f"{field_path(where, key)}: unknown field (known: {', '.join(sorted(known))})"
            )
        if name in found:
            raise UpstreamError(f"{field_path(where, key)}: given twice ({name})")
        found[name] = item
    return found


def whole(value: object, where: str, minimum: int = 0) -> int:
    """A Go uint (or int at least `minimum`): YAML/JSON integers only, no strings or fractions."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UpstreamError(f"{where}: must be a whole number of at least {minimum}, got {value!r}")
    return value


def number(value: object, where: str) -> float:
    """A Go float64: any finite YAML/JSON number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UpstreamError(f"{where}: must be a number, got {value!r}")
    return float(value)


def flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise UpstreamError(f"{where}: must be true or false, got {value!r}")
    return value


def text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise UpstreamError(f"{where}: must be a string, got {_kind(value)} {value!r}")
    return value


def items(value: object, where: str) -> list[Any]:
    """A list (null counts as empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise UpstreamError(f"{where}: must be a list, got {_kind(value)}")
    return value
