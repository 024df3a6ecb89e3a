"""What a bind writes for an Ascend fit, what a release drops, and Volcano's node lock.

Byte for byte what Volcano's `AscendDevices.Allocate` returns (`CreateAnnotations` plus the HAMi
bind keys): the device list twice (`-devices-to-allocate`, read by the node's device plugin, and
`-devices-allocated`, the scheduler's ledger), the runtime JSON `huawei.com/<commonWord>` (per card
its template name, or its memory and cores for a hami-core pod, Go's `json.Marshal` of
`[]RuntimeInfo`), the node name and the Unix time in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from deviceplugin.fit.ascend import AscendFit, trim_memory
from deviceplugin.fit.ascend_config import HAMI_PREFIX, VnpuChip
from deviceplugin.fit.codec import encode_pod_devices, encode_pod_devices_volcano
from deviceplugin.fit.model import Compat, FitResult, is_volcano_compat

ASSIGNED_NODE = f"{HAMI_PREFIX}/vgpu-node"
ASSIGNED_TIME = f"{HAMI_PREFIX}/vgpu-time"
BIND_PHASE = f"{HAMI_PREFIX}/bind-phase"
BIND_TIME = f"{HAMI_PREFIX}/bind-time"
PREDICATE_TIME = "predicate-time"  # no domain: Volcano writes the bare key
BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
NODE_LOCK = f"{HAMI_PREFIX}/mutex.lock"
NODE_LOCK_EXPIRES_S = 300  # Volcano's nodelock takes over a lock older than 5 minutes
NS_PER_S = 1_000_000_000

# Go's encoding/json escapes these in strings (HTML safety and JavaScript line separators).
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _go_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).translate(_GO_ESCAPES)


def runtime_json(result: FitResult, chip: VnpuChip) -> str:
    """`huawei.com/<commonWord>`: `[{"UUID":…,"temp":…}]` per card (a whole card has no `temp`),
    or `[{"UUID":…,"memory":…,"core":…}]` for a hami-core pod; zero values are left out, as Go's
    `omitempty` leaves them, and no card at all is `null`."""
    hami_core = isinstance(result, AscendFit) and result.hami_core
    entries = []
    for device in (device for container in result.devices for device in container):
        fields = [("UUID", _go_string(device.uuid))] if device.uuid else []
        if hami_core:
            fields += [
                (name, str(value))
                for name, value in (("memory", device.memory), ("core", device.cores))
                if value
            ]
        else:
            template = trim_memory(chip, device.memory)[1]
            fields += [("temp", _go_string(template))] if template else []
        entries.append("{" + ",".join(f'"{name}":{value}' for name, value in fields) + "}")
    return "[" + ",".join(entries) + "]" if entries else "null"


def encode_allocation(result: FitResult, compat: Compat = None) -> str:
    """`devices.EncodePodSingleDevice`: each card `UUID,commonWord,memory,cores:`, each requesting
    container ended by `;` (compat="volcano" formats whatever it holds, a negative number too)."""
    if is_volcano_compat(compat):
        return "".join(encode_pod_devices_volcano([container]) + ";" for container in result.devices)
    return encode_pod_devices(result.devices, "hami")


def ascend_bind_annotations(
    result: FitResult, chip: VnpuChip, node_name: str, now_ns: int, compat: Compat = None
) -> dict[str, str]:
    """The eight annotations of an Ascend bind (`now_ns`: the decision's Unix time; Volcano writes
    seconds)."""
    devices = encode_allocation(result, compat)
    now_s = str(now_ns // NS_PER_S)
    return {
        chip.to_allocate_key: devices,
        chip.allocated_key: devices,
        PREDICATE_TIME: now_s,
        chip.runtime_key: runtime_json(result, chip),
        ASSIGNED_NODE: node_name,
        ASSIGNED_TIME: now_s,
        BIND_PHASE: BIND_PHASE_ALLOCATING,
        BIND_TIME: now_s,
    }


def ascend_release_keys(annotations: Mapping[str, str], chips: Iterable[VnpuChip]) -> tuple[str, ...]:
    """Annotations to drop when an Ascend binding is undone (Volcano's `Release`): none once the
    device plugin has reported `bind-phase: success`; else the HAMi bind keys and, for every
    configured chip, its three device keys."""
    if annotations.get(BIND_PHASE) == BIND_PHASE_SUCCESS:
        return ()
    keys = [ASSIGNED_NODE, ASSIGNED_TIME, BIND_PHASE, BIND_TIME, PREDICATE_TIME]
    for chip in chips:
        keys += [chip.to_allocate_key, chip.allocated_key, chip.runtime_key]
    return tuple(keys)


def node_lock_value(now_ns: int) -> str:
    """The lock's value: the time it was taken, RFC 3339 (Go's `time.RFC3339`, here in UTC)."""
    return datetime.fromtimestamp(now_ns // NS_PER_S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_lock_held(value: str | None, now_ns: int) -> bool:
    """Whether `hami.io/mutex.lock` = `value` stops a bind now: it is there, and either younger than
    5 minutes or not an RFC 3339 time (Volcano's `LockNode` fails on a value it cannot parse)."""
    if value is None:
        return False
    try:
        taken = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return True
    if taken.tzinfo is None:
        return True  # RFC 3339 requires the offset
    return now_ns // NS_PER_S - int(taken.timestamp()) <= NODE_LOCK_EXPIRES_S
