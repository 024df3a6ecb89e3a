"""Fake GPUs (`--fake-gpus`) behind the `GpuBackend` interface, with injectable faults.

A spec is either `COUNTxMIB` (`2x10989`: two identical made-up GPUs) or the path of a JSON file
listing GPUs one by one:

    [{"uuid": "GPU-...", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa": 0},
     {"uuid": "GPU-...", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "fail": "Unknown Error"}]

Required keys: `uuid`, `model`, `memory_mib`. Optional: `numa` (default null), `minor` (default the
position), `pci_bus_id` (default made up), `mig_enabled` (default false), `mig_instances` (a card
in MIG mode that starts partitioned, as nvidia-mig-parted leaves it: a list of profile names such as
["3g.40gb", "3g.40gb"], placed at the first free placements; the model must be one
`deviceplugin.gpu.mig` has a table for) and `fail` (the GPU fails enumeration with that message). A
GPU's index is its position in the list.

MIG is modelled as NVML does it: the model's profile table, placements that may not overlap, at
most `max_count` instances of a profile (a misfit fails with "Insufficient Resources"), one
compute instance per GPU instance, GPU-instance ids from 1 up, MIG UUIDs derived from the card's
UUID and the GPU-instance id. Tests mark an instance busy (`set_mig_busy`) or make a create fail
(`fail_mig_create`).

Faults come in-process (`inject_xid`, `inject_wait_error`, `set_lost`) or from another process
through an events file of JSON lines, read on each `wait_event` as it grows:

    {"xid": 79, "uuid": "GPU-..."}      an Xid event (uuid omitted or null: unknown device)
    {"wait_error": "GPU is lost"}        the wait fails once, like NVML_ERROR_GPU_IS_LOST
    {"lost": "GPU-..."}                  the GPU stops answering (probe fails, enumeration fails)
    {"restore": "GPU-..."}               it answers again
    {"raise": "message"}                 every wait raises RuntimeError(message), an error no
                                         backend is meant to raise, until {"raise": null}
    {"mig_fail": "GPU-...", "error": "Unknown Error", "after": 0}
                                         the GPU-instance create after `after` more successful
                                         ones on that card fails with the driver text `error`
    {"mig_busy": "GPU-...", "gi": 1, "busy": true}
                                         a process holds (or no longer holds) that GPU instance

MIG calls apply the events file's new lines first, so a line written before a call counts for it.

Xid events and wait errors are delivered in the order they were injected.

The GPUs' interconnect comes from `--fake-gpu-topology` (a preset or a topology file,
`deviceplugin.gpu.topology`), which must describe as many GPUs as the spec lists; without it the
backend knows no topology. With it, each GPU sits on the topology's NUMA node (none where it gives
-1), which a spec's `numa` may repeat but not contradict.
"""

from __future__ import annotations

import re
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from deviceplugin.fit import jsontext
from deviceplugin.fit.model import MigGroup, MigInstance
from deviceplugin.fit.topology import UNKNOWN_NUMA, Topology
from deviceplugin.gpu import mig
from deviceplugin.gpu.base import (
    BackendError,
    EnumerationError,
    GpuInfo,
    Inventory,
    MigBusy,
    MigDevice,
    MigError,
    MigMatch,
    WaitError,
    XidEvent,
)
from deviceplugin.gpu.topology import NamedTopology, restrict
from deviceplugin.logs import get_log

log = get_log(__name__)

FAKE_MODEL = "Fake GPU"
MAX_GPUS = 64
# Fixed so that the same index yields the same UUID in every run and every process.
_UUID_NAMESPACE = uuidlib.UUID("6f1d3a52-9c1e-4b7a-8e0f-2a4c5d6e7f80")
# How often a waiter looks at the events file; in-process injections wake it at once.
_POLL_S = 0.05
_COUNT_FORM = re.compile(r"([+-]?\d*)[xX]([+-]?\d*)", re.ASCII)
_UUID_SHAPE = re.compile(r"GPU-[0-9A-Za-z-]+", re.ASCII)
_ENTRY_KEYS = frozenset(
    {"uuid", "model", "memory_mib", "numa", "minor", "pci_bus_id", "mig_enabled", "mig_instances", "fail"}
)


def fake_uuid(index: int) -> str:
    """The made-up UUID of the GPU at `index` in a `COUNTxMIB` spec."""
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'fake-gpu-{index}')}"


def _fake_bus_id(index: int) -> str:
    return f"00000000:{index + 1:02X}:00.0"


def fake_mig_uuid(gpu_uuid: str, gpu_instance: int) -> str:
    """The made-up UUID of the MIG device of GPU instance `gpu_instance` on a fake card."""
    return f"MIG-{uuidlib.uuid5(_UUID_NAMESPACE, f'{gpu_uuid}/gi-{gpu_instance}')}"


@dataclass(frozen=True, slots=True)
class FakeSpec:
    inventory: Inventory
    mig_layouts: Mapping[str, tuple[str, ...]]  # card UUID -> profiles it starts partitioned into


@dataclass(slots=True)
class _Instance:
    profile: mig.MigProfile
    start: int
    busy: bool = False


@dataclass(slots=True)
class _CreateFailure:
    error: str
    after: int  # creates that still succeed first


@dataclass(frozen=True, slots=True)
class _MigFail:
    uuid: str
    failure: _CreateFailure


@dataclass(frozen=True, slots=True)
class _MigBusy:
    uuid: str
    gpu_instance: int
    busy: bool


def _spec_group(profiles: Sequence[str]) -> MigGroup:
    return MigGroup("the fake spec's mig_instances", tuple(MigInstance(name, 0, 1) for name in profiles))


@dataclass(frozen=True, slots=True)
class _WaitFailure:
    message: str


@dataclass(frozen=True, slots=True)
class _Lost:
    uuid: str
    lost: bool


@dataclass(frozen=True, slots=True)
class _Raise:
    message: str | None  # None: waits answer again


class FakeBackend:
    """Made-up GPUs; thread-safe. `inventory` reports lost GPUs as enumeration errors."""

    def __init__(
        self,
        inventory: Inventory,
        events_file: Path | None = None,
        mig_layouts: Mapping[str, tuple[str, ...]] | None = None,
        topology: Topology | None = None,  # of every GPU listed, by index
    ) -> None:
        self._inventory = inventory
        self._topology = topology
        self._known = {gpu.uuid for gpu in inventory.gpus}
        self._gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
        # GPU-instance id -> instance, for every card in MIG mode
        self._mig: dict[str, dict[int, _Instance]] = {
            gpu.uuid: {} for gpu in inventory.gpus if gpu.mig_enabled
        }
        self._mig_failures: dict[str, _CreateFailure] = {}
        self._events_file = events_file
        self._events_offset = 0
        self._cond = threading.Condition()
        self._queue: deque[XidEvent | _WaitFailure] = deque()
        self._lost: set[str] = set()
        self._watched: set[str] = set()
        self._raising: str | None = None
        self._closed = False
        for uuid, profiles in (mig_layouts or {}).items():
            model = self._model(uuid)
            for profile, start in mig.plan(model, _spec_group(profiles)):
                self._create(uuid, profile, start)

    @classmethod
    def from_spec(
        cls, spec: str, events_file: Path | None = None, topology: NamedTopology | None = None
    ) -> FakeBackend:
        """BackendError when the spec is malformed or the topology describes another GPU count."""
        parsed = parse_spec(spec)
        listed = len(parsed.inventory.gpus) + len(parsed.inventory.errors)
        inventory = parsed.inventory
        try:
            links = None if topology is None else topology.for_gpus(listed)
            if links is not None:
                inventory = _on_numa_nodes(inventory, links)
        except ValueError as err:
            raise BackendError(f"--fake-gpu-topology {topology}: {err}") from None
        return cls(inventory, events_file, parsed.mig_layouts, links)

    @property
    def watched(self) -> frozenset[str]:
        with self._cond:
            return frozenset(self._watched)

    # --- GpuBackend ----------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        with self._cond:
            lost = set(self._lost)
        if not lost:
            return self._inventory
        errors = self._inventory.errors + tuple(
            EnumerationError(gpu.index, "GPU is lost") for gpu in self._inventory.gpus if gpu.uuid in lost
        )
        return Inventory(
            gpus=tuple(gpu for gpu in self._inventory.gpus if gpu.uuid not in lost),
            errors=tuple(sorted(errors, key=lambda error: error.index)),
        )

    def topology(self, gpus: Sequence[GpuInfo]) -> Topology | None:
        if self._topology is None:
            return None
        return restrict(self._topology, [gpu.index for gpu in gpus])

    def watch(self, uuids: tuple[str, ...]) -> dict[str, str]:
        problems: dict[str, str] = {}
        with self._cond:
            for uuid in uuids:
                if uuid not in self._known:
                    problems[uuid] = "no such GPU"
                elif uuid in self._lost:
                    problems[uuid] = "GPU is lost"
                else:
                    self._watched.add(uuid)
        return problems

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._closed:
                self._read_events_file()
                if self._raising is not None:
                    raise RuntimeError(self._raising)
                if self._queue:
                    return self._take()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, _POLL_S) if self._events_file else remaining)
        return None

    def probe(self, uuid: str) -> bool:
        with self._cond:
            return uuid in self._known and uuid not in self._lost

    def close(self) -> None:
        """Wake any waiter (it returns None); the backend is not used afterwards."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- MIG -----------------------------------------------------------------------------------

    def mig_enabled(self, uuid: str) -> bool:
        with self._cond:
            self._answering(uuid)
            return uuid in self._mig

    def mig_devices(self, uuid: str) -> tuple[MigDevice, ...]:
        with self._cond:
            return self._devices(uuid)

    def partition(self, uuid: str, group: MigGroup) -> tuple[MigDevice, ...]:
        with self._cond:
            held = self._devices(uuid)
            model = self._model(uuid)
            if held:
                raise MigError(
                    f"GPU {uuid} already holds {mig.layout(d.profile for d in held)}; "
                    "its instances must be destroyed before it takes another geometry"
                )
            steps = mig.plan(model, group)
            created = mig.create_all(
                steps,
                lambda profile, start: self._create(uuid, profile, start),
                lambda device: self._destroy(uuid, device.gpu_instance),
            )
            return mig.slot_order(created, group)

    def clear_mig(self, uuid: str) -> None:
        with self._cond:
            devices = self._devices(uuid)
            instances = self._mig[uuid]
            for device in devices:
                if instances[device.gpu_instance].busy:
                    raise MigBusy(
                        f"GPU {uuid}: MIG device {device.uuid} ({device.profile}, GPU instance "
                        f"{device.gpu_instance}) is in use; no instance was destroyed",
                        device,
                    )
            instances.clear()

    def match_mig(self, uuid: str, groups: Sequence[MigGroup]) -> MigMatch | None:
        return mig.match_group(self.mig_devices(uuid), groups)

    def set_mig_busy(self, uuid: str, gpu_instance: int, busy: bool = True) -> None:
        """A process holds (or stops holding) the GPU instance, as the driver would see it."""
        with self._cond:
            self._apply_mig_busy(_MigBusy(uuid, gpu_instance, busy))

    def fail_mig_create(self, uuid: str, error: str, after: int = 0) -> None:
        """Make the GPU-instance create after `after` more successful ones on the card fail with
        the driver's text `error` (once)."""
        with self._cond:
            if uuid not in self._known:
                raise ValueError(f"no fake GPU {uuid}")
            self._mig_failures[uuid] = _CreateFailure(error, after)

    # --- MIG internals (lock held) -------------------------------------------------------------

    def _answering(self, uuid: str) -> None:
        try:
            self._read_events_file()
        except WaitError as err:
            raise MigError(str(err)) from err
        if uuid not in self._known:
            raise MigError(f"no GPU {uuid} on this node")
        if uuid in self._lost:
            raise MigError(f"GPU {uuid} is lost")

    def _devices(self, uuid: str) -> tuple[MigDevice, ...]:
        self._answering(uuid)
        if uuid not in self._mig:
            raise MigError(f"GPU {uuid} is not in MIG mode")
        instances = self._mig[uuid]
        return tuple(
            self._device(uuid, gi, instances[gi])
            for gi in sorted(instances, key=lambda gi: instances[gi].start)
        )

    @staticmethod
    def _device(uuid: str, gpu_instance: int, instance: _Instance) -> MigDevice:
        profile = instance.profile
        return MigDevice(
            gpu_instance,
            0,
            profile.name,
            instance.start,
            profile.memory_mib,
            fake_mig_uuid(uuid, gpu_instance),
        )

    def _model(self, uuid: str) -> mig.MigModel:
        gpu = self._gpus[uuid]
        return mig.require_model(gpu.model, gpu.memory_mib)

    def _create(self, uuid: str, profile: mig.MigProfile, start: int) -> MigDevice:
        """nvmlDeviceCreateGpuInstanceWithPlacement plus its full compute instance."""
        instances = self._mig[uuid]
        failure = self._mig_failures.get(uuid)
        if failure is not None:
            if failure.after == 0:
                del self._mig_failures[uuid]
                raise MigError(
                    f"creating a {profile.name} GPU instance on GPU {uuid} failed: {failure.error}"
                )
            failure.after -= 1
        cells = set(range(start, start + profile.span))
        taken = {
            cell for held in instances.values() for cell in range(held.start, held.start + held.profile.span)
        }
        same = sum(1 for held in instances.values() if held.profile.name == profile.name)
        if start not in profile.starts or cells & taken or same >= profile.max_count:
            raise MigError(
                f"creating a {profile.name} GPU instance at slice {start} on GPU {uuid} failed: "
                "Insufficient Resources"
            )
        gpu_instance = next(gi for gi in range(1, len(instances) + 2) if gi not in instances)
        instances[gpu_instance] = _Instance(profile, start)
        return self._device(uuid, gpu_instance, instances[gpu_instance])

    def _destroy(self, uuid: str, gpu_instance: int) -> None:
        del self._mig[uuid][gpu_instance]

    def _apply_mig_line(self, change: _MigFail | _MigBusy) -> None:
        if change.uuid not in self._known:
            log.warning("fake GPU event for an unknown GPU skipped", uuid=change.uuid)
        elif isinstance(change, _MigFail):
            self._mig_failures[change.uuid] = change.failure
        else:
            try:
                self._apply_mig_busy(change)
            except ValueError as err:
                log.warning("fake GPU event line skipped", file=str(self._events_file), reason=str(err))

    def _apply_mig_busy(self, change: _MigBusy) -> None:
        instance = self._mig.get(change.uuid, {}).get(change.gpu_instance)
        if instance is None:
            raise ValueError(f"no GPU instance {change.gpu_instance} on fake GPU {change.uuid}")
        instance.busy = change.busy

    # --- fault injection -----------------------------------------------------------------------

    def inject_xid(self, uuid: str | None, xid: int) -> None:
        self._enqueue(XidEvent(uuid, xid))

    def inject_wait_error(self, message: str) -> None:
        """Make one `wait_event` raise `WaitError(message)` (after any events already queued)."""
        self._enqueue(_WaitFailure(message))

    def set_lost(self, uuid: str, lost: bool) -> None:
        with self._cond:
            if uuid not in self._known:
                raise ValueError(f"no fake GPU {uuid}")
            self._apply_lost(_Lost(uuid, lost))

    # --- internals (called with the lock held, except _enqueue which takes it) -----------------

    def _enqueue(self, item: XidEvent | _WaitFailure) -> None:
        with self._cond:
            self._queue.append(item)
            self._cond.notify_all()

    def _take(self) -> XidEvent:
        item = self._queue.popleft()
        if isinstance(item, _WaitFailure):
            raise WaitError(item.message)
        return item

    def _apply_lost(self, change: _Lost) -> None:
        if change.lost:
            self._lost.add(change.uuid)
        else:
            self._lost.discard(change.uuid)

    def _read_events_file(self) -> None:
        """Apply the complete lines appended since the last read; a partial last line waits."""
        if self._events_file is None:
            return
        try:
            with self._events_file.open("rb") as stream:
                stream.seek(self._events_offset)
                chunk = stream.read()
        except FileNotFoundError:
            return  # the writer has not created it yet
        except OSError as err:
            raise WaitError(f"cannot read fake GPU events file {self._events_file}: {err}") from err
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        self._events_offset += end + 1
        for line in chunk[:end].split(b"\n"):
            if line.strip():
                self._apply_line(line)

    def _apply_line(self, line: bytes) -> None:
        try:
            change = _parse_event_line(line)
        except ValueError as err:
            log.warning(
                "fake GPU event line skipped",
                file=str(self._events_file),
                line=line.decode(errors="replace"),
                reason=str(err),
            )
            return
        if isinstance(change, _Raise):
            self._raising = change.message
        elif isinstance(change, _MigFail | _MigBusy):
            self._apply_mig_line(change)
        elif isinstance(change, _Lost):
            if change.uuid in self._known:
                self._apply_lost(change)
            else:
                log.warning("fake GPU event for an unknown GPU skipped", uuid=change.uuid)
        else:
            self._queue.append(change)


def _parse_event_line(line: bytes) -> XidEvent | _WaitFailure | _Lost | _Raise | _MigFail | _MigBusy:
    """One events-file line; ValueError says what is wrong with it."""
    record = jsontext.loads(line)  # every undecodable line is a ValueError
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if "mig_fail" in record or "mig_busy" in record:
        return _parse_mig_line(record)
    if "xid" in record:
        if not set(record) <= {"xid", "uuid"}:
            raise ValueError(f"unexpected keys {sorted(set(record) - {'xid', 'uuid'})}")
        xid, uuid = record["xid"], record.get("uuid")
        if not _is_int(xid) or xid < 0:
            raise ValueError(f"xid {xid!r} is not a non-negative integer")
        if uuid is not None and not isinstance(uuid, str):
            raise ValueError(f"uuid {uuid!r} is not a string or null")
        return XidEvent(uuid, xid)
    if len(record) != 1:
        raise ValueError("expected one of xid, wait_error, lost, restore, raise")
    ((key, value),) = record.items()
    if key == "raise" and value is None:
        return _Raise(None)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} needs a non-empty string")
    if key == "wait_error":
        return _WaitFailure(value)
    if key == "raise":
        return _Raise(value)
    if key in {"lost", "restore"}:
        return _Lost(value, key == "lost")
    raise ValueError(f"unknown key {key!r}")


def _parse_mig_line(record: dict[str, Any]) -> _MigFail | _MigBusy:
    if "mig_fail" in record:
        _only(record, {"mig_fail", "error", "after"})
        if "error" not in record:
            raise ValueError("mig_fail needs the driver's error text in error")
        after = record.get("after", 0)
        if not _is_int(after) or after < 0:
            raise ValueError(f"after {after!r} is not a non-negative integer")
        return _MigFail(_text_field(record, "mig_fail"), _CreateFailure(_text_field(record, "error"), after))
    _only(record, {"mig_busy", "gi", "busy"})
    if "gi" not in record:
        raise ValueError("mig_busy needs the GPU-instance id in gi")
    gpu_instance, busy = record.get("gi"), record.get("busy", True)
    if not _is_int(gpu_instance) or gpu_instance < 0:
        raise ValueError(f"gi {gpu_instance!r} is not a GPU-instance id")
    if not isinstance(busy, bool):
        raise ValueError(f"busy {busy!r} is not true or false")
    return _MigBusy(_text_field(record, "mig_busy"), gpu_instance, busy)


def _only(record: dict[str, Any], allowed: set[str]) -> None:
    if not set(record) <= allowed:
        raise ValueError(f"unexpected keys {sorted(set(record) - allowed)}")


def _on_numa_nodes(inventory: Inventory, topology: Topology) -> Inventory:
    """The GPUs on the topology's NUMA nodes (None where it gives -1), so that kubelet's topology
    hints (ListAndWatch) say what the published annotation says; ValueError where the spec names
    another node."""
    gpus = []
    for gpu in inventory.gpus:
        node = topology.numa_of(gpu.index)
        numa = None if node == UNKNOWN_NUMA else node
        if gpu.numa is not None and gpu.numa != numa:
            raise ValueError(f"GPU {gpu.index} is on NUMA node {node}, the spec says {gpu.numa}")
        gpus.append(replace(gpu, numa=numa))
    return Inventory(tuple(gpus), inventory.errors)


# --- spec parsing --------------------------------------------------------------------------------


def parse_spec(spec: str) -> FakeSpec:
    """The GPUs a `--fake-gpus` spec describes; `BackendError` naming the spec when malformed."""
    match = _COUNT_FORM.fullmatch(spec)
    try:
        if match is not None:
            return FakeSpec(_parse_count_form(match[1], match[2]), {})
        return _parse_gpu_list(_read_json_file(spec))
    except ValueError as err:
        raise BackendError(f"fake GPU spec {spec!r}: {err}") from err


def _parse_count_form(count_text: str, mib_text: str) -> Inventory:
    count = _parse_int(count_text)
    if count is None or not 1 <= count <= MAX_GPUS:
        raise ValueError(f"GPU count {count_text!r} is not a whole number from 1 to {MAX_GPUS}")
    memory_mib = _parse_int(mib_text)
    if memory_mib is None or memory_mib < 1:
        raise ValueError(f"memory {mib_text!r} MiB is not a whole number of at least 1")
    gpus = tuple(
        GpuInfo(
            index=index,
            uuid=fake_uuid(index),
            model=FAKE_MODEL,
            memory_mib=memory_mib,
            minor=index,
            pci_bus_id=_fake_bus_id(index),
        )
        for index in range(count)
    )
    return Inventory(gpus)


def _parse_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _read_json_file(path: str) -> object:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"neither COUNTxMIB (like 2x10989) nor a readable JSON file: {err}") from err
    try:
        return jsontext.loads(data)
    except ValueError as err:
        raise ValueError(f"invalid JSON: {err}") from err


def _parse_gpu_list(document: object) -> FakeSpec:
    if not isinstance(document, list):
        raise ValueError("the file must hold a JSON list of GPU objects")
    if len(document) > MAX_GPUS:
        raise ValueError(f"{len(document)} GPUs listed, at most {MAX_GPUS} allowed")
    gpus: list[GpuInfo] = []
    errors: list[EnumerationError] = []
    layouts: dict[str, tuple[str, ...]] = {}
    seen: set[str] = set()
    for index, entry in enumerate(document):
        try:
            gpu, failure = _parse_entry(index, entry)
            if gpu.uuid in seen:
                raise ValueError(f"duplicate uuid {gpu.uuid!r}")
            layout = _parse_mig_instances(gpu, entry)
        except (ValueError, MigError) as err:
            raise ValueError(f"GPU {index}: {err}") from err
        seen.add(gpu.uuid)
        if failure is None:
            gpus.append(gpu)
            if layout:
                layouts[gpu.uuid] = layout
        else:
            errors.append(EnumerationError(index, failure))
    return FakeSpec(Inventory(tuple(gpus), tuple(errors)), layouts)


def _parse_mig_instances(gpu: GpuInfo, entry: Any) -> tuple[str, ...]:
    """A pre-partitioned card's profiles, checked to fit its model as the driver would place them."""
    profiles = entry.get("mig_instances", [])
    if not isinstance(profiles, list) or not all(isinstance(name, str) for name in profiles):
        raise ValueError(f"mig_instances {profiles!r} is not a list of MIG profile names")
    if profiles and not gpu.mig_enabled:
        raise ValueError("mig_instances needs mig_enabled: true")
    if profiles:
        mig.plan(mig.require_model(gpu.model, gpu.memory_mib), _spec_group(profiles))
    return tuple(profiles)


def _parse_entry(index: int, entry: object) -> tuple[GpuInfo, str | None]:
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (allowed: {sorted(_ENTRY_KEYS)})")
    for key in ("uuid", "model", "memory_mib"):
        if key not in entry:
            raise ValueError(f"missing field {key!r}")
    uuid = entry["uuid"]
    if not isinstance(uuid, str) or not _UUID_SHAPE.fullmatch(uuid):
        raise ValueError(f"uuid {uuid!r} is not like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    memory_mib = entry["memory_mib"]
    if not _is_int(memory_mib) or memory_mib < 1:
        raise ValueError(f"memory_mib {memory_mib!r} is not a whole number of at least 1")
    mig_enabled = entry.get("mig_enabled", False)
    if not isinstance(mig_enabled, bool):
        raise ValueError(f"mig_enabled {mig_enabled!r} is not true or false")
    gpu = GpuInfo(
        index=index,
        uuid=uuid,
        model=_text_field(entry, "model"),
        memory_mib=memory_mib,
        minor=_optional_index(entry, "minor", default=index),
        pci_bus_id=_text_field(entry, "pci_bus_id") if "pci_bus_id" in entry else _fake_bus_id(index),
        numa=_optional_index(entry, "numa", default=None),
        mig_enabled=mig_enabled,
    )
    return gpu, _text_field(entry, "fail") if "fail" in entry else None


def _text_field(entry: dict[str, Any], key: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} {value!r} is not a non-empty string")
    return value


def _optional_index(entry: dict[str, Any], key: str, default: int | None) -> int | None:
    value = entry.get(key, default)
    if value is not None and (not _is_int(value) or value < 0):
        raise ValueError(f"{key} {value!r} is not a non-negative integer or null")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    # JSON true/false load as bool, which Python counts as int.
    return isinstance(value, int) and not isinstance(value, bool)
