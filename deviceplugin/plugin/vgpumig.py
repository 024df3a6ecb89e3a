"""Dynamic MIG on a `mig` vGPU node (docs/mig.md): the node's cards and their geometry groups
(`knownMigGeometries`), checked at start, and turning the scheduler's slot `GPU-<uuid>[<group>-<pos>]`
into the MIG device a container gets, partitioning the card first when it is idle.

A card takes another group only while no live allocation holds it: its instances are destroyed
and the group's created (the backend creates all or none). A card holding pods in one group is
never repartitioned for another; the Allocate is refused with the reason instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from deviceplugin.fit.mig import geometry_for
from deviceplugin.fit.model import MigGeometry, MigGroup
from deviceplugin.gpu import mig
from deviceplugin.gpu.base import GpuBackend, GpuInfo, MigBusy, MigDevice, MigError
from deviceplugin.logs import get_log
from deviceplugin.plugin.nodestate import card_type

log = get_log(__name__)


class MigRefusal(Exception):
    """A slot that cannot be served; `reason` is the metrics reason, the message says why."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Card:
    gpu: GpuInfo
    groups: tuple[MigGroup, ...]


class MigCards:
    """The node's cards with their geometry groups; one per daemon start, shared by the vGPU
    allocators (its lock keeps one card's partitioning to one call at a time)."""

    def __init__(
        self, backend: GpuBackend, gpus: Sequence[GpuInfo], geometries: Sequence[MigGeometry]
    ) -> None:
        self.backend = backend
        self.geometries = tuple(geometries)
        self.problems: list[str] = []  # why a card cannot run in MIG mode: the daemon refuses to start
        self._cards: dict[str, _Card] = {}
        self._lock = threading.Lock()
        for gpu in gpus:
            problem = self._check(gpu)
            if problem is not None:
                self.problems.append(f"GPU {gpu.index} ({gpu.uuid}, {gpu.model}): {problem}")

    def _check(self, gpu: GpuInfo) -> str | None:
        """Why the card cannot be a MIG card here (None: it can, and it is kept)."""
        if mig.model_for(gpu.model, gpu.memory_mib) is None:
            supported = ", ".join(model.key for model in mig.MIG_MODELS)
            return f"dynamic MIG has no profile table for this model (supported: {supported})"
        geometry = geometry_for(card_type(gpu), self.geometries)
        if geometry is None:
            return (
                f"no knownMigGeometries entry names it (an entry's models must occur in {card_type(gpu)!r}); "
                "Volcano's scheduler would share it as hami-core"
            )
        try:
            enabled = self.backend.mig_enabled(gpu.uuid)
        except MigError as err:
            return f"its MIG mode cannot be read: {err}"
        if not enabled:
            return f"MIG mode is off (enable it: nvidia-smi -i {gpu.index} -mig 1, then reset the GPU)"
        self._cards[gpu.uuid] = _Card(gpu, geometry.groups)
        self._report_layout(gpu, geometry.groups)
        return None

    def _report_layout(self, gpu: GpuInfo, groups: Sequence[MigGroup]) -> None:
        """A card partitioned before (nvidia-mig-parted, an earlier run) is used as it is when it
        is one of its groups; otherwise it is said so, and it is repartitioned once a pod asks."""
        try:
            devices = self.backend.mig_devices(gpu.uuid)
            match = self.backend.match_mig(gpu.uuid, groups)
        except MigError as err:
            log.warning("mig layout unreadable", index=gpu.index, uuid=gpu.uuid, error=str(err))
            return
        if match is not None:
            log.info("mig card partitioned", index=gpu.index, uuid=gpu.uuid, group=match.group)
        elif devices:
            log.warning(
                "mig card in no configured group: repartitioned when a pod asks and it holds none",
                index=gpu.index,
                uuid=gpu.uuid,
                layout=mig.layout(device.profile for device in devices),
                groups=",".join(group.name for group in groups),
            )

    def group(self, uuid: str, name: str, position: int) -> MigGroup:
        """The card's group `name` with `position` one of its slots; MigRefusal naming the groups
        or the slots there are."""
        card = self._cards[uuid]
        where = f"MIG slot {name}-{position} on GPU {card.gpu.index} ({uuid})"
        group = next((group for group in card.groups if group.name == name), None)
        if group is None:
            names = ", ".join(group.name for group in card.groups)
            raise MigRefusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                "mig-group-unknown",
                f"{where}: group {name!r} is not one of the {card.gpu.model}'s groups in knownMigGeometries "
                f"({names})",
            )
        if group.locate(position) is None:
            slots = sum(instance.count for instance in group.instances)
            raise MigRefusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                "mig-slot-unknown",
                f"{where}: group {name} has {slots} slot(s), 0 to {slots - 1} "
                f"({mig.layout(mig.group_profiles(group))})",
            )
        return group

    def device(
        self, uuid: str, name: str, position: int, *, holds_pods: Callable[[str], bool], change: bool
    ) -> MigDevice:
        """The MIG device of slot `position` of group `name` on card `uuid`. A card not in that
        group is partitioned into it when `change` and it holds no pod (`holds_pods`); otherwise
        MigRefusal says why not. On a refusal the card is as it was (or, after a failed create,
        empty: the backend removes what it created)."""
        group = self.group(uuid, name, position)
        card = self._cards[uuid]
        where = f"GPU {card.gpu.index} ({uuid})"
        with self._lock:
            try:
                match = self.backend.match_mig(uuid, card.groups)
            except MigError as err:
                raise MigRefusal(grpc.StatusCode.INTERNAL, "mig-failed", f"{where}: {err}") from None
            if match is not None and match.group == name:
                return match.devices[position]
            now = f"MIG group {match.group}" if match is not None else self._layout(uuid)
            if not change:
                raise MigRefusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "mig-not-partitioned",
                    f"{where} holds {now}, not MIG group {name}",
                )
            if holds_pods(uuid):
                raise MigRefusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "mig-card-busy",
                    f"{where} holds pods in {now}; it takes MIG group {name} only once they are gone",
                )
            try:
                self.backend.clear_mig(uuid)
            except MigBusy as err:
                raise MigRefusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "mig-card-busy",
                    f"{where} cannot be repartitioned into MIG group {name}: {err}",
                ) from None
            except MigError as err:
                raise MigRefusal(grpc.StatusCode.INTERNAL, "mig-failed", f"{where}: {err}") from None
            try:
                devices = self.backend.partition(uuid, group)
            except MigError as err:
                raise MigRefusal(
                    grpc.StatusCode.INTERNAL,
                    "mig-partition-failed",
                    f"{where} cannot be partitioned into MIG group {name}: {err}",
                ) from None
            log.info("mig card partitioned", index=card.gpu.index, uuid=uuid, group=name, was=now)
            return devices[position]

    def _layout(self, uuid: str) -> str:
        try:
            devices = self.backend.mig_devices(uuid)
        except MigError:
            return "an unreadable MIG layout"
        if not devices:
            return "no MIG instances"
        return f"MIG layout {mig.layout(device.profile for device in devices)}"
