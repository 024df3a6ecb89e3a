"""A line-by-line Python transcription of Volcano's Go device code, for differential tests.

Transcribed from volcano-sh/volcano at ed72c7c8 (`pkg/scheduler/api/devices/nvidia/gpushare`,
`.../nvidia/vgpu`, `.../devices/util.go`, `api/helpers.go:getTaskStatus`,
`cache/event_handlers.go:addTask`) and apimachinery's `resource.ParseQuantity`, keeping Go's
shapes: maps keyed by card ID, `uint` counters, `int32` requests, the order loops visit cards in.
It shares no code with `deviceplugin.fit` on purpose: the library under test is compared with it.
Go map iteration order is random; the transcription walks maps in key order, and the tests only
build cases whose outcome does not depend on that order. A Go panic raises `GoPanic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

U64 = 1 << 64


class GoPanic(Exception):
    """Where the Go code would crash the scheduler."""


def u(x: int) -> int:
    return x % U64


def i64(x: int) -> int:
    return (x + (1 << 63)) % U64 - (1 << 63)


def i32(x: int) -> int:
    return (x + (1 << 31)) % (1 << 32) - (1 << 31)


def float_to_u64(f: float) -> int:
    """amd64 `uint64(f)`."""

    def cvt(x: float) -> int:  # CVTTSD2SQ
        if math.isnan(x) or x >= 2.0**63 or x < -(2.0**63):
            return 1 << 63
        return u(int(x))

    if f < 2.0**63:
        return cvt(f)
    return cvt(f - 2.0**63) ^ (1 << 63)


def float_to_i64(f: float) -> int:
    if math.isnan(f) or f >= 2.0**63 or f < -(2.0**63):
        return -(1 << 63)
    return int(f)


# --- strconv ----------------------------------------------------------------------------------


def parse_uint(s: str, bit_size: int) -> tuple[int, str | None]:
    """strconv.ParseUint(s, 10, bitSize): (value, error), read digit by digit as Go does, so the
    first problem decides: a non-digit gives a syntax error, an overflow the range error."""
    if not s:
        return 0, "syntax"
    max_val = (1 << bit_size) - 1
    cutoff = (U64 - 1) // 10 + 1
    n = 0
    for c in s:
        if not "0" <= c <= "9":
            return 0, "syntax"
        if n >= cutoff:
            return max_val, "range"
        n = n * 10 + (ord(c) - ord("0"))
        if n > max_val:  # Go also tests n1 < n: the uint64 wrap, which max_val covers here
            return max_val, "range"
    return n, None


def parse_int(s: str, bit_size: int = 64) -> tuple[int, str | None]:
    """strconv.ParseInt(s, 10, bitSize)."""
    if not s:
        return 0, "syntax"
    neg = s[0] == "-"
    un, err = parse_uint(s[1:] if s[0] in "+-" else s, bit_size)
    if err is not None and err != "range":
        return 0, err
    cutoff = 1 << (bit_size - 1)
    if not neg and un >= cutoff:
        return cutoff - 1, "range"
    if neg and un > cutoff:
        return -cutoff, "range"
    return (-un if neg else un), None


def atoi(s: str) -> tuple[int, bool]:
    """strconv.Atoi on amd64 (its fast path for short strings gives the same results)."""
    value, err = parse_int(s)
    return value, err is None


def parse_uint32(s: str) -> tuple[int, bool]:
    value, err = parse_uint(s, 32)
    return value, err is None


_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")


def parse_bool(s: str) -> bool:
    return s in _GO_TRUE


# --- resource.Quantity ------------------------------------------------------------------------

_DEC = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@dataclass
class Quantity:
    exact: Fraction
    fast: tuple[int, int] | None  # (value, scale) of the int64Amount, None: inf.Dec

    def value(self) -> int:
        """Value(): rounded up, away from zero."""
        x = self.exact
        ceiled = math.ceil(x) if x >= 0 else -math.ceil(-x)
        return max(-((1 << 63) - 1), min(ceiled, (1 << 63) - 1))  # ParseQuantity caps at maxAllowed

    def as_int64(self) -> tuple[int, bool]:
        if self.fast is None:
            return 0, False
        value, scale = self.fast
        if scale == 0:
            return value, True
        if scale < 0:
            return 0, False
        r = value * 10**scale
        return (r, True) if -(1 << 63) <= r < (1 << 63) else (0, False)


def parse_quantity(text: Any) -> Quantity:
    s = text if isinstance(text, str) else repr(text)
    if s == "0":
        return Quantity(Fraction(0), (0, 0))
    pos, end, positive = 0, len(s), True
    if pos < end and s[0] in "+-":
        positive = s[0] == "+"
        pos += 1
    while pos < end and s[pos] == "0":
        pos += 1
    start = pos
    while pos < end and s[pos].isdigit() and s[pos].isascii():
        pos += 1
    num = s[start:pos] or "0"
    denom = ""
    if pos < end and s[pos] == ".":
        pos += 1
        start = pos
        while pos < end and s[pos].isdigit() and s[pos].isascii():
            pos += 1
        denom = s[start:pos]
    suffix = s[pos:]
    if suffix in _DEC:
        base, exponent, binary = 10, _DEC[suffix], False
    elif suffix in _BIN:
        base, exponent, binary = 2, _BIN[suffix], True
    elif len(suffix) > 1 and suffix[0] in "eE" and parse_int(suffix[1:])[1] is None:
        base, exponent, binary = 10, i32(parse_int(suffix[1:])[0]), False  # int32(parsed)
    else:
        raise ValueError(text)
    exact = Fraction(int(num + denom or "0"), 10 ** len(denom)) * Fraction(base) ** exponent
    if not positive:
        exact = -exact
    mantissa, scale = 1, 0
    if binary:
        if exponent >= 0 and not denom:
            mantissa = 1 << exponent
            precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        else:
            precision = -1
    else:
        scale = exponent
        precision = 18 - (len(num) + len(denom))
    if precision >= 0:
        scale -= len(denom)
        if scale >= -9:
            value = int(num + denom) * mantissa
            if value < (1 << 63):
                return Quantity(exact, (value if positive else -value, scale))
    return Quantity(exact, None)


# --- pods -------------------------------------------------------------------------------------


def notes_of(obj: dict[str, Any]) -> dict[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def task_status(pod: dict[str, Any]) -> str:
    phase = str((pod.get("status") or {}).get("phase", ""))
    deleting = bool(pod.get("metadata", {}).get("deletionTimestamp"))
    if phase == "Running":
        return "Releasing" if deleting else "Running"
    if phase == "Pending":
        return "Releasing" if deleting else "Bound"
    if phase in ("Succeeded", "Failed"):
        return phase
    return "Unknown"


def cache_books_devices(pod: dict[str, Any]) -> bool:
    """addTask skips terminated pods; AddTask books devices except for Releasing tasks."""
    return task_status(pod) not in ("Succeeded", "Failed", "Releasing")


def containers(pod: dict[str, Any], key: str = "containers") -> list[dict[str, Any]]:
    return (pod.get("spec") or {}).get(key) or []


def limits(c: dict[str, Any]) -> dict[str, Any]:
    return (c.get("resources") or {}).get("limits") or {}


def requests(c: dict[str, Any]) -> dict[str, Any]:
    return (c.get("resources") or {}).get("requests") or {}


# --- gpushare ---------------------------------------------------------------------------------

GPU_MEMORY = "volcano.sh/gpu-memory"
GPU_NUMBER = "volcano.sh/gpu-number"


@dataclass
class ShareDevice:
    id: int
    memory: int  # uint
    pod_map: dict[str, dict[str, Any]] = field(default_factory=dict)


def share_devices(node: dict[str, Any]) -> dict[int, ShareDevice] | None:
    capacity = (node.get("status") or {}).get("capacity") or {}
    if GPU_MEMORY not in capacity or GPU_NUMBER not in capacity:
        return None
    total = parse_quantity(capacity[GPU_MEMORY]).value()
    number = parse_quantity(capacity[GPU_NUMBER]).value()
    if number == 0:
        return None
    per_card = u(int(Fraction(total, number)))  # Go's int64 division truncates
    devices = {i: ShareDevice(i, per_card) for i in range(number)}
    unhealthy = notes_of(node).get("volcano.sh/gpu-unhealthy-ids")
    if unhealthy is not None:
        for sid in unhealthy.split(","):
            idx, ok = atoi(sid)
            if ok:
                devices.pop(idx, None)
    return devices


def gpu_memory_of_pod(pod: dict[str, Any]) -> int:
    init_mem = 0
    for c in containers(pod, "initContainers"):
        res = u(parse_quantity(limits(c)[GPU_MEMORY]).value()) if GPU_MEMORY in limits(c) else 0
        init_mem = max(init_mem, res)
    mem = 0
    for c in containers(pod):
        if GPU_MEMORY in limits(c):
            mem = u(mem + u(parse_quantity(limits(c)[GPU_MEMORY]).value()))
    return mem if mem > init_mem else init_mem


def gpu_number_of_pod(pod: dict[str, Any]) -> int:
    gpus = 0
    for c in containers(pod):
        if GPU_NUMBER in limits(c):
            gpus = i64(gpus + parse_quantity(limits(c)[GPU_NUMBER]).value())
    init_gpus = 0
    for c in containers(pod, "initContainers"):
        if GPU_NUMBER in limits(c):
            init_gpus = max(init_gpus, i64(parse_quantity(limits(c)[GPU_NUMBER]).value()))
    return gpus if gpus > init_gpus else init_gpus


def gpu_index(pod: dict[str, Any]) -> list[int] | None:
    value = notes_of(pod).get("volcano.sh/gpu-index")
    if value is None:
        return None
    ids = []
    for item in value.split(","):
        j, ok = atoi(item)
        if not ok:
            return None
        ids.append(j)
    return ids


def share_add_resource(devices: dict[int, ShareDevice], pod: dict[str, Any]) -> None:
    if gpu_memory_of_pod(pod) > 0 or gpu_number_of_pod(pod) > 0:
        for idx in gpu_index(pod) or []:
            if idx in devices:
                devices[idx].pod_map[pod["metadata"]["uid"]] = pod


def share_used_memory(dev: ShareDevice) -> int:
    res = 0
    for pod in dev.pod_map.values():
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        res = u(res + gpu_memory_of_pod(pod))
    return res


def predicate_by_memory(devices: dict[int, ShareDevice], pod: dict[str, Any]) -> list[int]:
    request = gpu_memory_of_pod(pod)
    ids = []
    for dev in devices.values():
        used = share_used_memory(dev)
        idle = 0 if used >= dev.memory else dev.memory - used
        if idle >= request:
            ids.append(dev.id)
    return sorted(ids)


def idle_cards(devices: dict[int, ShareDevice]) -> list[int]:
    return [dev.id for dev in devices.values() if not dev.pod_map]


@dataclass
class ShareOutcome:
    """What the scheduler does with a pod on a node: fits, and the cards Allocate picks.

    `cards` is None for the number branch, whose cards come in random map order; `idle` then
    lists the cards it chooses from and `count` how many it takes."""

    fits: bool
    cards: list[int] | None = None
    idle: list[int] = field(default_factory=list)
    count: int = 0


def share_schedule(
    devices: dict[int, ShareDevice] | None, pod: dict[str, Any], sharing: bool
) -> ShareOutcome:
    mem, num = gpu_memory_of_pod(pod), gpu_number_of_pod(pod)
    has_request = mem > 0 if sharing else num > 0
    if devices is None or not has_request:
        return ShareOutcome(True, [])
    if sharing:
        if not predicate_by_memory(devices, pod):
            return ShareOutcome(False)
    elif len(idle_cards(devices)) < num:
        return ShareOutcome(False)
    # Allocate
    if mem > 0:
        ids = predicate_by_memory(devices, pod)
        return ShareOutcome(True, ids[:1]) if ids else ShareOutcome(False)
    idle = idle_cards(devices)
    return ShareOutcome(True, None, idle, num)


# --- vGPU -------------------------------------------------------------------------------------

VGPU_NUMBER = "volcano.sh/vgpu-number"
VGPU_MEMORY = "volcano.sh/vgpu-memory"
VGPU_CORES = "volcano.sh/vgpu-cores"


@dataclass
class Geometry:
    group: str
    instances: list[tuple[str, int, int]]  # name, memory, count


@dataclass
class MigUsage:
    name: str
    memory: int
    used_index: list[int]


@dataclass
class VDevice:
    id: int
    uuid: str
    number: int
    memory: int
    type: str
    health: bool
    used_num: int = 0
    used_mem: int = 0
    used_core: int = 0
    pod_map: dict[str, list[Any]] = field(default_factory=dict)  # uid -> [mem, core, group key]
    mig_template: list[Geometry] = field(default_factory=list)
    mig_index: int = -1
    mig_usage: list[MigUsage] = field(default_factory=list)

    def copy(self) -> VDevice:
        dup = VDevice(**{**self.__dict__})
        dup.pod_map = {k: list(v) for k, v in self.pod_map.items()}
        dup.mig_usage = [MigUsage(m.name, m.memory, list(m.used_index)) for m in self.mig_usage]
        return dup


@dataclass
class VConfig:
    percentage_name: str = ""
    factor: int = 1
    geometries: list[tuple[list[str], list[Geometry]]] = field(default_factory=list)


@dataclass
class VNode:
    devices: dict[int, VDevice]
    mode: str


def decode_node_devices(value: str, config: VConfig) -> VNode | None:
    if ":" not in value:
        return None
    devices: dict[int, VDevice] = {}
    mode = "hami-core"
    for index, piece in enumerate(value.split(":")):
        if "," not in piece:
            continue
        items = piece.split(",")
        if len(items) < 6:
            return None
        count, _ = atoi(items[1])
        mem, _ = atoi(items[2])
        dev = VDevice(index, items[0], u(count), u(mem), items[3], parse_bool(items[4]))
        mode = "mig" if items[5] == "mig" else "hami-core"
        if mode == "mig":
            found = [geoms for models, geoms in config.geometries if any(m in dev.type for m in models)]
            if found:
                dev.mig_template = found[0]
            else:
                mode = "hami-core"
        devices[index] = dev
    return VNode(devices, mode)


def vgpu_node(node: dict[str, Any], config: VConfig) -> VNode | None:
    value = notes_of(node).get("volcano.sh/node-vgpu-register")
    if value is None:
        return None
    allocatable = (node.get("status") or {}).get("allocatable")
    if allocatable is None:
        return None
    for name in (VGPU_NUMBER, VGPU_CORES, VGPU_MEMORY):
        if name not in allocatable or parse_quantity(allocatable[name]).value() == 0:
            return None
    decoded = decode_node_devices(value, config)
    if decoded is None or not decoded.devices:
        return None
    return decoded


def decode_pod_devices(value: str) -> list[list[tuple[str, str, int, int]]]:
    if not value:
        return []
    result = []
    for part in value.split(";"):
        devs = []
        for piece in part.split(":") if part else []:
            if "," not in piece:
                continue
            items = piece.split(",")
            if len(items) < 4:
                continue
            mem, ok = parse_uint32(items[2])
            if not ok:
                continue
            cores, ok = parse_uint32(items[3])
            if not ok:
                continue
            devs.append((items[0], items[1], mem, cores))
        result.append(devs)
    return result


def decode_mig_id(device_id: str) -> tuple[str, int] | None:
    start, end = device_id.find("["), device_id.find("]")
    if start == -1 or end == -1 or start > end:
        return None
    parts = device_id[start + 1 : end].split("-")
    if len(parts) != 2:
        return None
    position, ok = atoi(parts[1])
    return (parts[0], position) if ok else None


def find_position(group: Geometry, position: int) -> tuple[int, int]:
    total = 0
    for i, (_, _, count) in enumerate(group.instances):
        if position < total + count:
            return i, position - total
        total += count
    return -1, -1


def add_mig_used(dev: VDevice, group_name: str, position: int) -> int:
    for gi, group in enumerate(dev.mig_template):
        if group.group != group_name:
            continue
        dev.mig_index = gi
        ii, ri = find_position(group, position)
        if ii < 0:
            raise GoPanic("index out of range [-1]")
        name, memory, _ = group.instances[ii]
        for usage in dev.mig_usage:
            if usage.name == name:
                if ri not in usage.used_index:
                    usage.used_index = sorted([*usage.used_index, ri])
                return usage.memory
        dev.mig_usage.append(MigUsage(name, memory, [ri]))
        return memory
    return 0


def sub_mig_used(dev: VDevice, group_name: str, position: int) -> int:
    for gi, group in enumerate(dev.mig_template):
        if group.group != group_name:
            continue
        dev.mig_index = gi
        ii, ri = find_position(group, position)
        if ii < 0:
            raise GoPanic("index out of range [-1]")
        name = group.instances[ii][0]
        for k, usage in enumerate(dev.mig_usage):
            if usage.name != name:
                continue
            if ri in usage.used_index:
                usage.used_index.remove(ri)
            mem = usage.memory
            if not usage.used_index:
                del dev.mig_usage[k]
            return mem
        return 0
    return 0


def group_key(pod: dict[str, Any]) -> str:
    notes = notes_of(pod)
    name = notes.get("scheduling.k8s.io/group-name") or notes.get("scheduling.volcano.sh/group-name") or ""
    return "" if not name else f"{pod['metadata'].get('namespace', '')}/{name}"


def vgpu_add_resource(node: VNode, pod: dict[str, Any], config: VConfig) -> None:
    ids = notes_of(pod).get("volcano.sh/vgpu-ids-new")
    if ids is None:
        return
    uid = pod["metadata"]["uid"]
    for devs in decode_pod_devices(ids):
        for dev_uuid, _, entry_mem, cores in devs:
            mem = entry_mem
            for dev in node.devices.values():
                if dev.uuid not in dev_uuid:
                    continue
                if node.mode == "mig":
                    parsed = decode_mig_id(dev_uuid)
                    if parsed is None or uid in dev.pod_map:
                        break
                    dev.pod_map[uid] = [0, 0, ""]
                    mem = add_mig_used(dev, *parsed)
                    if config.factor > 1:
                        mem //= config.factor
                elif uid in dev.pod_map:
                    dev.pod_map[uid][2] = group_key(pod)
                    break
                else:
                    dev.pod_map[uid] = [0, 0, ""]
                dev.used_num = u(dev.used_num + 1)
                dev.used_mem = u(dev.used_mem + mem)
                dev.used_core = u(dev.used_core + cores)
                dev.pod_map[uid] = [mem, cores, group_key(pod)]
                break


def vgpu_sub_resource(node: VNode, pod: dict[str, Any], config: VConfig) -> None:
    ids = notes_of(pod).get("volcano.sh/vgpu-ids-new")
    if ids is None:
        return
    uid = pod["metadata"]["uid"]
    for devs in decode_pod_devices(ids):
        for dev_uuid, _, entry_mem, cores in devs:
            mem = entry_mem
            for dev in node.devices.values():
                if dev.uuid not in dev_uuid:
                    continue
                if node.mode == "mig":
                    parsed = decode_mig_id(dev_uuid)
                    if parsed is None or uid not in dev.pod_map:
                        break
                    mem = sub_mig_used(dev, *parsed)
                    if config.factor > 1:
                        mem //= config.factor
                elif uid not in dev.pod_map:
                    break
                dev.used_num = u(dev.used_num - 1)
                dev.used_mem = u(dev.used_mem - mem)
                dev.used_core = u(dev.used_core - cores)
                del dev.pod_map[uid]
                break


@dataclass
class Request:
    nums: int
    memreq: int
    percentage: int
    coresreq: int


def _quantity_int32(c: dict[str, Any], name: str) -> int | None:
    if name in limits(c):
        raw = limits(c)[name]
    elif name in requests(c):
        raw = requests(c)[name]
    else:
        return None
    value, ok = parse_quantity(raw).as_int64()
    return i32(value) if ok else None  # a value AsInt64 refuses leaves Go's default in place


def extract_requests(pod: dict[str, Any], config: VConfig) -> list[Request]:
    out = []
    for c in containers(pod):
        single = False
        if VGPU_NUMBER in limits(c):
            v = limits(c)[VGPU_NUMBER]
        elif VGPU_MEMORY in limits(c):
            v, single = limits(c)[VGPU_MEMORY], True
        else:
            continue
        n = 1 if single else parse_quantity(v).as_int64()[0]
        mem = _quantity_int32(c, VGPU_MEMORY) or 0
        pct = 101
        if config.percentage_name:
            got = _quantity_int32(c, config.percentage_name)
            if got is not None:
                pct = got
        if pct == 101 and mem == 0:
            pct = 100
        cores = _quantity_int32(c, VGPU_CORES) or 0
        out.append(Request(i32(n), mem, pct, cores))
    return out


def has_vgpu_request(pod: dict[str, Any]) -> bool:
    return any(VGPU_MEMORY in limits(c) or VGPU_NUMBER in limits(c) for c in containers(pod))


def check_gpu_type(notes: dict[str, str], card_type: str) -> bool:
    if "nvidia.com/use-gputype" in notes:
        return any(v.upper() in card_type.upper() for v in notes["nvidia.com/use-gputype"].split(","))
    if "nvidia.com/nouse-gputype" in notes:
        return not any(v.upper() in card_type.upper() for v in notes["nvidia.com/nouse-gputype"].split(","))
    return True


def uuid_list(value: str | None) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def pick_from_group(group: Geometry, usage: list[MigUsage] | None, request: int) -> tuple[bool, int, int]:
    ordered = sorted(enumerate(group.instances), key=lambda item: item[1][1])  # stable, by memory
    for index, (name, memory, count) in ordered:
        if not usage and memory >= request:
            return True, _position(group, count, [], index), memory
        for used in usage or []:
            if used.name == name and count - len(used.used_index) > 0 and memory >= request:
                return True, _position(group, count, used.used_index, index), memory
    return False, -1, 0


def _position(group: Geometry, count: int, used: list[int], index: int) -> int:
    position = sum(group.instances[i][2] for i in range(index))
    for i in range(count):
        if i not in used:
            return position + i
    return position


def try_add_pod(node: VNode, dev: VDevice, mem: int, core: int, config: VConfig) -> tuple[bool, str]:
    if node.mode == "mig":
        request = u(mem * config.factor) if config.factor > 1 else mem
        found = None
        if dev.mig_index >= 0:
            group = dev.mig_template[dev.mig_index]
            ok, position, real = pick_from_group(group, dev.mig_usage, request)
            if ok:
                found = (f"{dev.uuid}[{group.group}-{position}]", real)
        else:
            for group in dev.mig_template:
                ok, position, real = pick_from_group(group, None, request)
                if ok:
                    found = (f"{dev.uuid}[{group.group}-{position}]", real)
                    break
        if found is None:
            return False, ""
        real = found[1] // config.factor if config.factor > 1 else found[1]
        dev.used_num = u(dev.used_num + 1)
        dev.used_mem = u(dev.used_mem + real)
        dev.used_core = u(dev.used_core + core)
        return True, found[0]
    dev.used_num = u(dev.used_num + 1)
    dev.used_mem = u(dev.used_mem + mem)
    dev.used_core = u(dev.used_core + core)
    return True, dev.uuid


def sorted_indices(node: VNode, policy: str) -> list[int]:
    keys = list(node.devices)
    if policy == "binpack":
        return sorted(keys, key=lambda k: (-node.devices[k].used_mem, k))
    if policy == "spread":
        return sorted(keys, key=lambda k: (node.devices[k].used_num, k))
    return list(range(len(keys) - 1, -1, -1))


def gpu_score(policy: str, dev: VDevice) -> float:
    if policy == "binpack":
        try:
            return 100 * (float(dev.used_mem) / float(dev.memory))
        except ZeroDivisionError:
            return math.nan if dev.used_mem == 0 else math.inf
    if policy == "spread":
        return 100.0 if dev.used_num == 0 else 0.0
    return 0.0


@dataclass
class VOutcome:
    fits: bool
    devices: list[list[tuple[str, str, int, int]]] = field(default_factory=list)  # uuid, type, mem, cores
    score: float = 0.0


def vgpu_fit(node: VNode | None, pod: dict[str, Any], policy: str, config: VConfig) -> VOutcome:
    """HasDeviceRequest, then checkNodeGPUSharingPredicateAndScore on a snapshot."""
    if node is None or not has_vgpu_request(pod):
        return VOutcome(True)
    notes = notes_of(pod)
    if "volcano.sh/vgpu-mode" in notes and notes["volcano.sh/vgpu-mode"] != node.mode:
        return VOutcome(False)
    reqs = extract_requests(pod, config)
    if not reqs:
        return VOutcome(True)
    snap = VNode({k: d.copy() for k, d in node.devices.items()}, node.mode)
    key = group_key(pod) if notes.get("volcano.sh/vgpu-podgroup-policy") == "spread" else ""
    allow, deny = (
        uuid_list(notes.get("volcano.sh/vgpu-use-gpuuuid")),
        uuid_list(notes.get("volcano.sh/vgpu-nouse-gpuuuid")),
    )
    score = 0.0
    placed = []
    for req in reqs:
        nums = req.nums
        devs = []
        if nums > len(snap.devices):
            return VOutcome(False)
        for i in sorted_indices(snap, policy):
            if i not in snap.devices:
                raise GoPanic("nil pointer dereference")
            dev = snap.devices[i]
            if (allow or deny) and (dev.uuid == "" or (allow and dev.uuid not in allow) or dev.uuid in deny):
                continue
            if dev.number <= dev.used_num:
                continue
            if key and any(g == key and (m > 0 or c > 0) for m, c, g in dev.pod_map.values()):
                continue
            if req.percentage != 101:
                need = float_to_u64(float(dev.memory) * float(req.percentage) / 100.0)
            else:
                need = u(req.memreq)
            if i64(i64(dev.memory) - i64(dev.used_mem)) < i64(need):
                continue
            if u(dev.used_core + u(req.coresreq)) > 100:
                continue
            if req.coresreq == 100 and dev.used_num > 0:
                continue
            if dev.used_core == 100 and req.coresreq == 0:
                continue
            if "NVIDIA" not in dev.type or not check_gpu_type(notes, dev.type):
                continue
            ok, dev_id = try_add_pod(snap, dev, need, u(req.coresreq), config)
            if not ok:
                continue
            if nums > 0:
                nums -= 1
                devs.append((dev_id, "NVIDIA", i64(need), i64(u(req.coresreq))))
                score += gpu_score(policy, dev)
            if nums == 0:
                break
        if nums > 0:
            return VOutcome(False)
        placed.append(devs)
    return VOutcome(True, placed, score)


def node_score(score: float, weight: int) -> float:
    if weight <= 0:
        return 0.0
    x = score + 0.5
    return float(float_to_i64(math.floor(x) if math.isfinite(x) else x)) * weight
