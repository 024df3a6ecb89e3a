"""A container's amount of one extended resource (its limit, else its request), read strictly
(the default) or as Volcano reads it; shared by the device families' request parsers."""

from __future__ import annotations

from deviceplugin.fit import goint, objects
from deviceplugin.fit.errors import QuantityError, RequestError
from deviceplugin.fit.quantity import go_quantity_as_int64, quantity_as_int64


def given(container: objects.Obj, name: str) -> object | None:
    """The quantity for `name` from the container's limits, else its requests; None if neither."""
    if not name:
        return None
    limits = objects.limits(container)
    return limits[name] if name in limits else objects.requests(container).get(name)


def strict(container: objects.Obj, name: str, where: str) -> int | None:
    """A non-negative integer; None if absent; RequestError naming `where` and `name` if bad."""
    raw = given(container, name)
    if raw is None:
        return None
    try:
        value = quantity_as_int64(raw)
    except QuantityError as err:
        raise RequestError(f"{where}: {name}: {err}") from None
    if value is None or value < 0:
        raise RequestError(f"{where}: {name} must be a non-negative whole number, not {raw!r}")
    return value


def volcano(container: objects.Obj, name: str) -> int | None:
    """Volcano's reading: AsInt64 wrapped to int32; None if absent or when AsInt64 refuses the
    value (Go then keeps its default)."""
    raw = given(container, name)
    value = None if raw is None else go_quantity_as_int64(raw)
    return None if value is None else goint.int32(value)


def volcano_count(container: objects.Obj, count_name: str, memory_name: str) -> int | None:
    """Volcano's device count: the count limit (AsInt64 wrapped to int32, 0 where it refuses),
    else one device when only memory is limited; None when the container limits neither."""
    limits = objects.limits(container)
    if count_name in limits:
        return goint.int32(go_quantity_as_int64(limits[count_name]) or 0)
    return 1 if memory_name in limits else None
