"""Ascend 310P nodes of a simulated cluster, and the check of what the scheduler wrote on their pods.

The node side of Ascend vNPUs is HAMi's Ascend device plugin, not this project's daemon, so an
Ascend node runs nothing here: it carries what that plugin leaves on its Node, written the way the
plugin writes it (`ascend-device-plugin` internal/server/register.go), and an Ascend pod ends bound
with the scheduler's annotations, which the plugin would then serve:

- `hami.io/node-register-Ascend310P`: Go's `json.Marshal([]DeviceInfo)`, every field `omitempty`:
  per card `id`, `index` (left out for card 0), `count` (vNPU slots: 21527 MiB // 3072, the smallest
  template, = 7), `devmem` 21527, `devcore` 8 (100 on a hami-core node), `type`, `health`;
- `hami-vnpu-core`: "true" or "false";
- allocatable (and capacity) `huawei.com/Ascend310P`: the slots of every card.

The check states the scheduler's rules itself (docs/ascend.md), independent of the fit library.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deviceplugin.fit import objects
from deviceplugin.fit.quantity import parse_quantity

CHIP = "Ascend310P"
COUNT = f"huawei.com/{CHIP}"
MEMORY = f"{COUNT}-memory"
CORE = f"{COUNT}-core"
REGISTER = f"hami.io/node-register-{CHIP}"
HAMI_CORE_NODE = "hami-vnpu-core"
VNPU_MODE = "huawei.com/vnpu-mode"
ALLOCATED = f"hami.io/{CHIP}-devices-allocated"
TO_ALLOCATE = f"hami.io/{CHIP}-devices-to-allocate"
BIND_PHASE = "hami.io/bind-phase"
BIND_NODE = "hami.io/vgpu-node"
#: The plugin's built-in 310P: card memory the scheduler may give out, and the templates by MiB.
CARD_MIB = 21527
CAPACITY_MIB = 24576
TEMPLATES = (("vir01", 3072), ("vir02", 6144), ("vir04", 12288))
SLOTS = CARD_MIB // TEMPLATES[0][1]
AI_CORES = 8
_IDS = uuidlib.UUID("5a3e0f7c-2b1d-4c9e-8f6a-3d7b9e1c2a40")


@dataclass(frozen=True)
class AscendNodeSpec:
    name: str
    cards: int = 2
    hami_core: bool = True  # the node runs HAMi-core's soft split (`hami-vnpu-core: "true"`)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(f"NPU-{uuidlib.uuid5(_IDS, f'{self.name}/{i}')}" for i in range(self.cards))

    @property
    def mode(self) -> str:
        return "hami-core" if self.hami_core else "template"

    @property
    def shape(self) -> str:
        return f"{self.cards}x{CARD_MIB} {CHIP} (no daemon: HAMi's Ascend plugin)"

    def registration(self) -> str:
        """What the HAMi Ascend device plugin writes (Go's json.Marshal, omitempty on every field)."""
        cards = []
        for index, card in enumerate(self.ids):
            entry: dict[str, Any] = {"id": card}
            if index:
                entry["index"] = index
            cores = 100 if self.hami_core else AI_CORES
            entry.update(count=SLOTS, devmem=CARD_MIB, devcore=cores, type=CHIP, health=True)
            cards.append(entry)
        return json.dumps(cards, separators=(",", ":"))

    def node(self, labels: Mapping[str, str]) -> dict[str, Any]:
        notes = {REGISTER: self.registration(), HAMI_CORE_NODE: "true" if self.hami_core else "false"}
        return {"metadata": {"name": self.name, "labels": dict(labels), "annotations": notes}}

    def status(self) -> dict[str, Any]:
        slots = {COUNT: str(SLOTS * self.cards)}
        return {"capacity": slots, "allocatable": slots}


def asks_ascend(pod: Mapping[str, Any]) -> bool:
    return any(
        name in (COUNT, MEMORY, CORE)
        for container in objects.containers(pod)
        for name in [*objects.limits(container), *objects.requests(container)]
    )


def _template(memory: int) -> tuple[int, str]:
    """The memory booked for a template-mode request, and its template ("" for a whole card)."""
    for name, size in TEMPLATES:
        if memory <= size:
            return size, name
    return CARD_MIB, ""


def verify_ascend(pod: Mapping[str, Any], node: AscendNodeSpec) -> list[str]:
    """What is wrong with the annotations the scheduler bound an Ascend pod with."""
    key = objects.namespaced_name(pod)
    notes = objects.annotations_of(pod)
    problems = []
    if notes.get(BIND_NODE) != node.name or notes.get(BIND_PHASE) != "allocating":
        problems.append(
            f"{key}: {BIND_NODE} / {BIND_PHASE} are {notes.get(BIND_NODE)!r} / {notes.get(BIND_PHASE)!r}"
        )
    allocated = notes.get(ALLOCATED, "")
    if allocated != notes.get(TO_ALLOCATE):
        problems.append(f"{key}: {ALLOCATED} and {TO_ALLOCATE} differ")
    hami_core = objects.annotations_of(pod).get(VNPU_MODE) == "hami-core"
    segments = [s for s in allocated.split(";") if s]
    asking = [c for c in objects.containers(pod) if {COUNT, MEMORY} & set(objects.limits(c))]
    runtime = json.loads(notes.get(COUNT, "null") or "null") or []
    if len(segments) != len(asking):
        return [*problems, f"{key}: {ALLOCATED} {allocated!r} has no entry per container asking for vNPUs"]
    entries = iter(runtime)
    for container, segment in zip(asking, segments, strict=True):
        limits = objects.limits(container)
        asked = int(parse_quantity(limits.get(MEMORY, "0")))
        booked, template = (asked, "") if hami_core else _template(asked or CARD_MIB)
        for card in (c for c in segment.split(":") if c):
            uuid, chip, memory, cores = card.split(",")
            entry: dict[str, Any] = next(entries, {})
            name = objects.container_name(container)
            if uuid not in node.ids or chip != CHIP:
                problems.append(
                    f"{key} container {name}: card {uuid} ({chip}) is not registered on {node.name}"
                )
            if int(memory) != booked:
                problems.append(f"{key} container {name}: booked {memory} MiB, the rules give {booked}")
            want: dict[str, Any] = {"UUID": uuid}
            if hami_core:
                want |= {"memory": booked} if booked else {}
                want |= {"core": int(cores)} if int(cores) else {}
            elif template:
                want["temp"] = template
            if entry != want:
                problems.append(f"{key} container {name}: {COUNT} entry {entry} should be {want}")
    return problems
