"""Annotation codecs: pod devices, node registration, GPU index lists, memory factor, MIG device IDs.

Decoders are strict by default and raise an `AnnotationError` subclass naming the position and
the problem. `compat="volcano"` decoders read values the way Volcano does (skipping what it skips,
reading unparsable numbers as 0) so a conformance suite can compare decisions.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Literal

from deviceplugin.fit import goint, keys
from deviceplugin.fit.bounds import MAX_NODE_GPUS, parse_decimal, shown
from deviceplugin.fit.errors import AnnotationError, GpuIndexError, NodeRegisterError, PodDevicesError
from deviceplugin.fit.model import Assigned, Compat, GpuState, is_volcano_compat

Dialect = Literal["volcano", "hami"]
DIALECTS = ("volcano", "hami")

_SEPARATORS = (",", ":", ";")
_GO_BOOL = {
    "1": True,
    "t": True,
    "T": True,
    "TRUE": True,
    "true": True,
    "True": True,
    "0": False,
    "f": False,
    "F": False,
    "FALSE": False,
    "false": False,
    "False": False,
}
_MIG_ID = re.compile(r"(?P<uuid>[^\[\]]+)\[(?P<group>[^\[\]]+)-(?P<position>[0-9]+)\]")


def _check_field(value: str, what: str, error: type[ValueError]) -> str:
    if not value or any(sep in value for sep in _SEPARATORS):
        raise error(f"{what} {value!r} must be non-empty and free of ',', ':' and ';'")
    return value


def _check_count(value: int, what: str, error: type[ValueError]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error(f"{what} must be a non-negative integer, not {value!r}")
    return value


# --- GPU index lists -------------------------------------------------------------------------


def format_gpu_index(indices: Iterable[int]) -> str:
    """`[0, 2, 3]` -> `"0,2,3"` (the `volcano.sh/gpu-index` form)."""
    items = [_check_count(i, "GPU index", GpuIndexError) for i in indices]
    if not items:
        raise GpuIndexError("a GPU index list needs at least one index")
    return ",".join(str(i) for i in items)


def _parse_indices(value: str) -> list[int]:
    where = f"GPU index list {shown(value)} (want comma-separated integers): item"
    return [
        parse_decimal(item.strip(), where, GpuIndexError, meaning="a GPU index", kind="a GPU index")
        for item in value.split(",")
    ]


def parse_gpu_index(value: str) -> list[int]:
    """`"0,2,3"` -> `[0, 2, 3]`. Spaces around items are allowed; anything else, or a GPU named
    twice, is an error."""
    indices = _parse_indices(value)
    if len(set(indices)) != len(indices):
        raise GpuIndexError(f"GPU index list {shown(value)} names a GPU twice")
    return indices


def parse_gpu_index_volcano(value: str) -> list[int] | None:
    """Volcano's reading of `gpu-index`: Atoi per item; any failure discards the whole list."""
    parsed = [goint.parse_int(item) for item in value.split(",")]
    return [index for index, _ in parsed] if all(ok for _, ok in parsed) else None


def parse_unhealthy_ids(value: str, compat: Compat = None) -> frozenset[int]:
    """`volcano.sh/gpu-unhealthy-ids`: indices of unhealthy GPUs ("" means none).

    Volcano skips entries it cannot parse; by default they are an error, because a card whose
    health cannot be read must not be treated as healthy.
    """
    if is_volcano_compat(compat):
        parsed = (goint.parse_int(item) for item in value.split(","))
        return frozenset(index for index, ok in parsed if ok)
    if not value.strip():
        return frozenset()
    return frozenset(_parse_indices(value))


# --- MIG device IDs --------------------------------------------------------------------------


def parse_memory_factor(value: object) -> int:
    """A node's `volcano.sh/gpu-memory-factor` annotation: MiB per memory unit its plugin
    advertises (a positive whole number)."""
    what = f"annotation {keys.GPU_MEMORY_FACTOR}"
    factor = parse_decimal(
        str(value).strip(), what, AnnotationError, kind="a positive whole number", meaning="a memory factor"
    )
    if factor <= 0:
        raise AnnotationError(f"{what} {value!r} is not a positive whole number")
    return factor


def encode_mig_id(uuid: str, group: str, position: int) -> str:
    """`GPU-…[group-position]`: a slot of a MIG geometry group on a card."""
    for what, text in (("UUID", uuid), ("MIG group", group)):
        if "[" in text or "]" in text:
            raise PodDevicesError(f"{what} {text!r} must not contain brackets")
        _check_field(text, what, PodDevicesError)
    _check_count(position, "MIG position", PodDevicesError)
    return f"{uuid}[{group}-{position}]"


def encode_mig_id_volcano(uuid: str, group: str, position: int) -> str:
    """Volcano's `encodeMIGID`: plain formatting, so a card registered without a UUID gives
    `[group-position]`."""
    return f"{uuid}[{group}-{position}]"


def decode_mig_id(device_id: str) -> tuple[str, str, int]:
    """(card UUID, group, position) of a MIG device ID."""
    match = _MIG_ID.fullmatch(device_id)
    if match is None:
        raise PodDevicesError(f"device {shown(device_id)} is not a MIG device ID (UUID[group-position])")
    where = f"MIG device {shown(device_id)}: position"
    position = parse_decimal(match["position"], where, PodDevicesError, meaning="an int64")
    return match["uuid"], match["group"], position


def decode_mig_id_volcano(device_id: str) -> tuple[str, int] | None:
    """Volcano's reading: text between the first '[' and ']', split on '-' into exactly 2 parts."""
    start, end = device_id.find("["), device_id.find("]")
    if start < 0 or end < 0 or start > end:
        return None
    parts = device_id[start + 1 : end].split("-")
    if len(parts) != 2:
        return None
    position, ok = goint.parse_int(parts[1])
    return (parts[0], position) if ok else None


def physical_uuid(device_id: str) -> str:
    """The card UUID of a device ID (a MIG ID carries a `[group-position]` suffix)."""
    bracket = device_id.find("[")
    return device_id if bracket < 0 else device_id[:bracket]


# --- pod devices -----------------------------------------------------------------------------


def _encode_container(devices: Iterable[Assigned]) -> str:
    parts = []
    for dev in devices:
        uuid = _check_field(dev.uuid, "device UUID", PodDevicesError)
        kind = _check_field(dev.type, "device type", PodDevicesError)
        memory = _check_count(dev.memory, "device memory", PodDevicesError)
        cores = _check_count(dev.cores, "device cores", PodDevicesError)
        parts.append(f"{uuid},{kind},{memory},{cores}:")
    return "".join(parts)


def encode_pod_devices(containers: Iterable[Iterable[Assigned]], dialect: Dialect = "volcano") -> str:
    """Per-container device lists -> annotation value.

    Each device is `UUID,Type,Memory,Cores:`. Volcano joins containers with `;`; HAMi ends every
    container (empty ones included) with `;`.
    """
    encoded = [_encode_container(devices) for devices in containers]
    if dialect == "volcano":
        return ";".join(encoded)
    if dialect == "hami":
        return "".join(f"{part};" for part in encoded)
    raise PodDevicesError(f"unknown pod devices dialect {dialect!r} (want 'volcano' or 'hami')")


def encode_pod_devices_volcano(containers: Iterable[Iterable[Assigned]]) -> str:
    """Volcano's `encodePodDevices`: plain formatting, containers joined by `;`."""
    return ";".join(
        "".join(f"{d.uuid},{d.type},{d.memory},{d.cores}:" for d in devices) for devices in containers
    )


def _decode_entry(entry: str, where: str) -> Assigned:
    fields = entry.split(",")
    where = f"{where} {shown(entry)}:"
    if len(fields) != 4:
        raise PodDevicesError(f"{where} expected 4 fields UUID,Type,Memory,Cores")
    uuid, kind, memory, cores = fields
    if not uuid or not kind:
        raise PodDevicesError(f"{where} empty UUID or type")
    return Assigned(
        uuid=uuid,
        index=None,
        type=kind,
        memory=parse_decimal(memory, f"{where} memory", PodDevicesError, meaning="an int64"),
        cores=parse_decimal(cores, f"{where} cores", PodDevicesError, meaning="an int64"),
    )


def _decode_container(segment: str, number: int) -> list[Assigned]:
    if not segment:
        return []
    if not segment.endswith(":"):
        raise PodDevicesError(f"container {number} {shown(segment)}: every device must end with ':'")
    entries = segment[:-1].split(":")
    return [_decode_entry(e, f"container {number} device {k}") for k, e in enumerate(entries)]


def _decode_container_volcano(segment: str) -> list[Assigned]:
    devices = []
    for piece in segment.split(":"):
        if "," not in piece:
            continue
        fields = piece.split(",")
        if len(fields) < 4:
            continue
        memory, memory_ok = goint.parse_uint(fields[2], 32)  # ParseUint(…, 10, 32): errors skip it
        cores, cores_ok = goint.parse_uint(fields[3], 32)
        if memory_ok and cores_ok:
            devices.append(Assigned(uuid=fields[0], index=None, type=fields[1], memory=memory, cores=cores))
    return devices


def decode_pod_devices(
    value: str, dialect: Dialect = "volcano", compat: Compat = None
) -> list[list[Assigned]]:
    """Annotation value -> per-container device lists (decoded devices carry `index=None`).

    HAMi's trailing `;` terminates the last container; it does not add an empty one.
    """
    volcano = is_volcano_compat(compat)
    if dialect not in DIALECTS:
        raise PodDevicesError(f"unknown pod devices dialect {dialect!r} (want 'volcano' or 'hami')")
    if volcano:
        if dialect != "volcano":
            raise PodDevicesError("compat='volcano' reads the Volcano dialect only")
        return [] if not value else [_decode_container_volcano(s) for s in value.split(";")]
    if not value:
        return []
    if dialect == "hami":
        if not value.endswith(";"):
            raise PodDevicesError(f"HAMi pod devices {shown(value)} must end with ';'")
        value = value[:-1]
    return [_decode_container(segment, n) for n, segment in enumerate(value.split(";"))]


# --- node registration -----------------------------------------------------------------------


def encode_node_register(gpus: Iterable[GpuState], legacy: bool = False) -> str:
    """GPUs -> `volcano.sh/node-vgpu-register`, ordered by index.

    Each GPU is `UUID,count,memory,type,health,mode:`; `legacy=True` writes the 5-field form of
    Volcano <= 1.11 (no mode).
    """
    parts = []
    seen: set[str] = set()
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.uuid in seen:
            raise NodeRegisterError(f"GPU {gpu.uuid} is listed twice")
        seen.add(gpu.uuid)
        uuid = _check_field(gpu.uuid, "GPU UUID", NodeRegisterError)
        kind = _check_field(gpu.type, "GPU type", NodeRegisterError)
        count = _check_count(gpu.split_count, "split count", NodeRegisterError)
        memory = _check_count(gpu.memory, "GPU memory", NodeRegisterError)
        fields = [uuid, str(count), str(memory), kind, "true" if gpu.health else "false"]
        if not legacy:
            if gpu.mode not in keys.SHARING_MODES:
                raise NodeRegisterError(f"GPU {uuid}: mode {gpu.mode!r} is not one of {keys.SHARING_MODES}")
            fields.append(gpu.mode)
        parts.append(",".join(fields) + ":")
    return "".join(parts)


def _decode_register_entry(piece: str, index: int) -> GpuState:
    fields = piece.split(",")
    if len(fields) == 5:
        fields.append(keys.MODE_HAMI_CORE)  # legacy writers had no mode: HAMi-core
    if len(fields) != 6:
        raise NodeRegisterError(
            f"GPU {index} {shown(piece)}: expected UUID,count,memory,type,health,mode "
            "(or the 5-field legacy form)"
        )
    uuid, count, memory, kind, health, mode = fields
    where = f"GPU {index} {shown(piece)}:"
    if not uuid or not kind:
        raise NodeRegisterError(f"{where} empty UUID or type")
    if health not in _GO_BOOL:
        raise NodeRegisterError(f"{where} health {shown(health)} is not true or false")
    if mode not in keys.SHARING_MODES:
        raise NodeRegisterError(f"{where} mode {shown(mode)} is not one of {keys.SHARING_MODES}")
    return GpuState(
        index=index,
        uuid=uuid,
        type=sys.intern(kind),  # a scheduler holds every node's cards: one string per model
        memory=parse_decimal(memory, f"{where} memory", NodeRegisterError, meaning="an int64"),
        split_count=parse_decimal(count, f"{where} count", NodeRegisterError, meaning="an int64"),
        health=_GO_BOOL[health],
        mode=sys.intern(mode),
    )


def _decode_register_volcano(value: str) -> list[GpuState]:
    if ":" not in value:
        return []
    gpus = []
    for index, piece in enumerate(value.split(":")):
        if "," not in piece:
            continue
        fields = piece.split(",")
        if len(fields) < 6:
            return []  # one short entry voids the whole node
        gpus.append(
            GpuState(
                index=index,
                uuid=fields[0],
                type=sys.intern(fields[3]),
                memory=goint.parse_int(fields[2])[0],  # Atoi's errors ignored, as Volcano does
                split_count=goint.parse_int(fields[1])[0],
                health=_GO_BOOL.get(fields[4], False),
                mode=keys.MODE_MIG if fields[5] == keys.MODE_MIG else keys.MODE_HAMI_CORE,
            )
        )
    return gpus


def decode_node_register(value: str, compat: Compat = None) -> list[GpuState]:
    """`volcano.sh/node-vgpu-register` -> GPUs (no usage), index = position in the value."""
    if is_volcano_compat(compat):
        return _decode_register_volcano(value)
    if not value:
        return []
    if not value.endswith(":"):
        raise NodeRegisterError(f"node registration {shown(value)}: every GPU must end with ':'")
    pieces = value[:-1].split(":")
    if len(pieces) > MAX_NODE_GPUS:
        raise NodeRegisterError(
            f"node registration lists {len(pieces)} GPUs; a node has at most {MAX_NODE_GPUS}"
        )
    gpus = [_decode_register_entry(piece, i) for i, piece in enumerate(pieces)]
    seen: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen:
            raise NodeRegisterError(f"node registration lists GPU {gpu.uuid} twice")
        seen.add(gpu.uuid)
    return gpus
