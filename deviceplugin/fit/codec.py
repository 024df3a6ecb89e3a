"""Annotation codecs: pod devices, node registration, GPU index lists, MIG device IDs.

Decoders are strict by default and raise an `AnnotationError` subclass naming the position and
the problem. `compat="volcano"` decoders read values the way Volcano does (skipping what it skips,
reading unparsable numbers as 0) so a conformance suite can compare decisions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from deviceplugin.fit import keys
from deviceplugin.fit.errors import GpuIndexError, NodeRegisterError, PodDevicesError
from deviceplugin.fit.model import Assigned, Compat, GpuState, is_volcano_compat

Dialect = Literal["volcano", "hami"]
DIALECTS = ("volcano", "hami")

# ASCII digits only: `\d` would also accept other scripts' digits, which Go and Kubernetes reject.
_DIGITS = re.compile(r"[0-9]+")
_GO_INT = re.compile(r"[+-]?[0-9]+")
_UINT32_MAX = 2**32 - 1
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


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def go_atoi(text: str) -> tuple[int, bool]:
    """Go's `strconv.Atoi` on 64 bits: (value, ok). Only an optional sign and ASCII digits parse;
    a syntax error gives (0, False), an out-of-range number its clamped value and False."""
    if not _GO_INT.fullmatch(text):
        return 0, False
    value = int(text)
    clamped = min(max(value, _INT64_MIN), _INT64_MAX)
    return clamped, clamped == value


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
    items = [item.strip() for item in value.split(",")]
    bad = [item for item in items if not _DIGITS.fullmatch(item)]
    if bad:
        raise GpuIndexError(
            f"GPU index list {value!r}: {bad[0]!r} is not a GPU index (want comma-separated integers)"
        )
    return [int(item) for item in items]


def parse_gpu_index(value: str) -> list[int]:
    """`"0,2,3"` -> `[0, 2, 3]`. Spaces around items are allowed; anything else, or a GPU named
    twice, is an error."""
    indices = _parse_indices(value)
    if len(set(indices)) != len(indices):
        raise GpuIndexError(f"GPU index list {value!r} names a GPU twice")
    return indices


def parse_gpu_index_volcano(value: str) -> list[int] | None:
    """Volcano's reading of `gpu-index`: Atoi per item; any failure discards the whole list."""
    parsed = [go_atoi(item) for item in value.split(",")]
    return [index for index, _ in parsed] if all(ok for _, ok in parsed) else None


def parse_unhealthy_ids(value: str, compat: Compat = None) -> frozenset[int]:
    """`volcano.sh/gpu-unhealthy-ids`: indices of unhealthy GPUs ("" means none).

    Volcano skips entries it cannot parse; by default they are an error, because a card whose
    health cannot be read must not be treated as healthy.
    """
    if is_volcano_compat(compat):
        parsed = (go_atoi(item) for item in value.split(","))
        return frozenset(index for index, ok in parsed if ok)
    if not value.strip():
        return frozenset()
    return frozenset(_parse_indices(value))


# --- MIG device IDs --------------------------------------------------------------------------


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
        raise PodDevicesError(f"device {device_id!r} is not a MIG device ID (UUID[group-position])")
    return match["uuid"], match["group"], int(match["position"])


def decode_mig_id_volcano(device_id: str) -> tuple[str, int] | None:
    """Volcano's reading: text between the first '[' and ']', split on '-' into exactly 2 parts."""
    start, end = device_id.find("["), device_id.find("]")
    if start < 0 or end < 0 or start > end:
        return None
    parts = device_id[start + 1 : end].split("-")
    if len(parts) != 2:
        return None
    position, ok = go_atoi(parts[1])
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
    if len(fields) != 4:
        raise PodDevicesError(f"{where} {entry!r}: expected 4 fields UUID,Type,Memory,Cores")
    uuid, kind, memory, cores = fields
    if not uuid or not kind:
        raise PodDevicesError(f"{where} {entry!r}: empty UUID or type")
    for name, text in (("memory", memory), ("cores", cores)):
        if not _DIGITS.fullmatch(text):
            raise PodDevicesError(f"{where} {entry!r}: {name} {text!r} is not a non-negative integer")
    return Assigned(uuid=uuid, index=None, type=kind, memory=int(memory), cores=int(cores))


def _decode_container(segment: str, number: int) -> list[Assigned]:
    if not segment:
        return []
    if not segment.endswith(":"):
        raise PodDevicesError(f"container {number} {segment!r}: every device must end with ':'")
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
        memory, cores = fields[2], fields[3]
        if not (_DIGITS.fullmatch(memory) and _DIGITS.fullmatch(cores)):
            continue
        if int(memory) > _UINT32_MAX or int(cores) > _UINT32_MAX:
            continue
        devices.append(
            Assigned(uuid=fields[0], index=None, type=fields[1], memory=int(memory), cores=int(cores))
        )
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
            raise PodDevicesError(f"HAMi pod devices {value!r} must end with ';'")
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
            f"GPU {index} {piece!r}: expected UUID,count,memory,type,health,mode (or the 5-field legacy form)"
        )
    uuid, count, memory, kind, health, mode = fields
    if not uuid or not kind:
        raise NodeRegisterError(f"GPU {index} {piece!r}: empty UUID or type")
    for name, text in (("count", count), ("memory", memory)):
        if not _DIGITS.fullmatch(text):
            raise NodeRegisterError(f"GPU {index} {piece!r}: {name} {text!r} is not a non-negative integer")
    if health not in _GO_BOOL:
        raise NodeRegisterError(f"GPU {index} {piece!r}: health {health!r} is not true or false")
    if mode not in keys.SHARING_MODES:
        raise NodeRegisterError(f"GPU {index} {piece!r}: mode {mode!r} is not one of {keys.SHARING_MODES}")
    return GpuState(
        index=index,
        uuid=uuid,
        type=kind,
        memory=int(memory),
        split_count=int(count),
        health=_GO_BOOL[health],
        mode=mode,
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
                type=fields[3],
                memory=go_atoi(fields[2])[0],  # errors ignored, as Volcano does
                split_count=go_atoi(fields[1])[0],
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
        raise NodeRegisterError(f"node registration {value!r}: every GPU must end with ':'")
    gpus = [_decode_register_entry(piece, i) for i, piece in enumerate(value[:-1].split(":"))]
    seen: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen:
            raise NodeRegisterError(f"node registration lists GPU {gpu.uuid} twice")
        seen.add(gpu.uuid)
    return gpus
