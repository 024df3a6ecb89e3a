"""`hami.io/node-register-<commonWord>`: the Ascend chips a node's HAMi device plugin registers.

The value is Go's `json.Marshal([]DeviceInfo)` and Volcano reads it back with `json.Unmarshal`
(`devices.UnMarshalNodeDevices`), so it is read here by Go's rules, not Python's: names match
regardless of case (bytes.EqualFold: the long s, U+017F, is an 's'), a later duplicate name wins,
unknown names are ignored, null leaves a field at its zero value, and a number must be an integer
literal within its Go field's range (`1.0`, `1e3` and 2^31 for an int32 fail). Any such failure
voids the whole annotation, as it does in Go. Python's json module parses the text (its number,
NaN and object hooks keep the literals and the key order Go sees); nothing here re-implements JSON
syntax.

By default the chips must also make sense to a scheduler: each with a non-empty unique ID free of
the device-list separators, non-negative counts, a node of at most `MAX_NODE_GPUS` chips.
compat="volcano" keeps Volcano's reading: duplicate IDs collapse into the last one, and a null
entry (a nil pointer Volcano would dereference) voids the node.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from deviceplugin.fit import goint, jsontext
from deviceplugin.fit.bounds import MAX_NODE_GPUS, shown
from deviceplugin.fit.errors import NodeRegisterError
from deviceplugin.fit.jsontext import TooDeep
from deviceplugin.fit.model import Compat, is_volcano_compat

_SEPARATORS = (",", ":", ";")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class NpuInfo:
    """One registered chip (`devices.DeviceInfo`, the fields a 310P scheduler reads)."""

    id: str = ""
    index: int = 0
    count: int = 0  # vNPU slots
    devmem: int = 0  # MiB
    devcore: int = 0  # AI cores, or 100 on a hami-core node
    type: str = ""
    health: bool = False


class _Number(str):
    """A JSON number's literal text, as Go's decoder converts it per field."""

    integer = True


class _Float(_Number):
    integer = False


class _Object(list[tuple[str, object]]):
    """A JSON object's (name, value) pairs in text order."""


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _string(value: object, where: str) -> str:
    if not isinstance(value, str) or isinstance(value, _Number):
        raise NodeRegisterError(f"{where} must be a JSON string")
    return _LONE_SURROGATE.sub("\ufffd", value)  # Go decodes a lone surrogate escape as U+FFFD


def _integer(bits: int, signed: bool) -> Callable[[object, str], int]:
    def read(value: object, where: str) -> int:
        if not isinstance(value, _Number) or not value.integer:
            raise NodeRegisterError(f"{where} must be an integer, not {shown(str(value))}")
        number, ok = goint.parse_int(value, bits) if signed else goint.parse_uint(value, bits)
        if not ok:
            raise NodeRegisterError(f"{where} {shown(value)} is out of range for its Go field")
        return number

    return read


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise NodeRegisterError(f"{where} must be true or false")
    return value


def _object(check: Callable[[object, str], object]) -> Callable[[object, str], object]:
    def read(value: object, where: str) -> object:
        if not isinstance(value, _Object):
            raise NodeRegisterError(f"{where} must be a JSON object")
        for name, item in value:
            if item is not None:
                check(item, f"{where}.{name}")
        return value

    return read


def _anything(value: object, where: str) -> object:
    return value


def _pair_score(value: object, where: str) -> object:
    if not isinstance(value, _Object):
        raise NodeRegisterError(f"{where} must be a JSON object")
    _fields(value, where, _PAIR_SCORE_FIELDS)
    return value


_FIELDS: dict[str, Callable[[object, str], object]] = {
    "id": _string,
    "index": _integer(64, signed=False),
    "count": _integer(32, signed=True),
    "devmem": _integer(32, signed=True),
    "devcore": _integer(32, signed=True),
    "type": _string,
    "numa": _integer(64, signed=True),
    "mode": _string,
    "health": _boolean,
    "devicevendor": _string,
    "custominfo": _object(_anything),
    "devicepairscore": _pair_score,
}
_PAIR_SCORE_FIELDS: dict[str, Callable[[object, str], object]] = {
    "uuid": _string,
    "score": _object(_integer(64, signed=True)),
}


def _fold(name: str) -> str:
    return name.lower().replace("\u017f", "s")  # the one non-ASCII letter EqualFold maps onto these names


def _fields(
    pairs: _Object, where: str, schema: dict[str, Callable[[object, str], object]]
) -> dict[str, object]:
    found: dict[str, object] = {}
    for name, value in pairs:
        field = _fold(name)
        read = schema.get(field)
        if read is None or value is None:
            continue
        found[field] = read(value, f"{where} field {name!r}")
    return found


def _info(pairs: _Object, where: str) -> NpuInfo:
    found = _fields(pairs, where, _FIELDS)
    return NpuInfo(**{name: found[name] for name in NpuInfo.__slots__ if name in found})  # type: ignore[arg-type]


def _parse(value: str) -> list[NpuInfo | None]:
    try:
        loaded = jsontext.loads(
            value,
            parse_int=_Number,
            parse_float=_Float,
            parse_constant=_no_constant,
            object_pairs_hook=_Object,
        )
    except TooDeep as err:
        raise NodeRegisterError(f"node registration {shown(value)} is {err}") from None
    except ValueError as err:
        raise NodeRegisterError(f"node registration {shown(value)} is not valid JSON: {err}") from None
    if loaded is None:
        return []
    if not isinstance(loaded, list) or isinstance(loaded, _Object):
        raise NodeRegisterError(f"node registration {shown(value)} must be a JSON list of chips")
    chips: list[NpuInfo | None] = []
    for number, item in enumerate(loaded):
        if item is not None and not isinstance(item, _Object):
            raise NodeRegisterError(f"node registration chip {number} must be a JSON object")
        chips.append(None if item is None else _info(item, f"node registration chip {number}"))
    return chips


def _check(chips: list[NpuInfo | None]) -> list[NpuInfo]:
    if len(chips) > MAX_NODE_GPUS:
        raise NodeRegisterError(
            f"node registration lists {len(chips)} chips; a node has at most {MAX_NODE_GPUS}"
        )
    seen: set[str] = set()
    checked = []
    for number, chip in enumerate(chips):
        where = f"node registration chip {number}"
        if chip is None:
            raise NodeRegisterError(f"{where} is null")
        if not chip.id or any(sep in chip.id for sep in _SEPARATORS):
            raise NodeRegisterError(f"{where}: id {chip.id!r} must be non-empty and free of ',', ':' and ';'")
        if chip.id in seen:
            raise NodeRegisterError(f"{where}: id {chip.id!r} is registered twice")
        seen.add(chip.id)
        for what in ("count", "devmem", "devcore"):
            if getattr(chip, what) < 0:
                raise NodeRegisterError(f"{where} ({chip.id}): {what} is negative")
        checked.append(chip)
    return checked


def decode_npu_register(value: str, compat: Compat = None) -> list[NpuInfo]:
    """The chips of a node registration, in registration order (NodeRegisterError by default when
    it does not decode or makes no sense; compat="volcano": an empty list, as Volcano then sees
    no chips of this type on the node)."""
    if not is_volcano_compat(compat):
        return _check(_parse(value))
    try:
        chips = _parse(value)
    except NodeRegisterError:
        return []
    if any(chip is None for chip in chips):
        return []
    by_id = {chip.id: chip for chip in chips if chip is not None}  # Volcano's map: the last one wins
    return list(by_id.values())
