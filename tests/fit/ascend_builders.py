"""Ascend 310P nodes, pods and cards for the Ascend fit tests."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from deviceplugin.fit.ascend import HAMI_CORE, TEMPLATE_MODE
from deviceplugin.fit.ascend_config import ASCEND310P, VnpuChip, VnpuTemplate
from deviceplugin.fit.model import GpuState
from tests.fit.builders import Obj, container, pod

COUNT = "huawei.com/Ascend310P"
MEMORY = "huawei.com/Ascend310P-memory"
CORE = "huawei.com/Ascend310P-core"
REGISTER = "hami.io/node-register-Ascend310P"
ALLOCATED = "hami.io/Ascend310P-devices-allocated"
MODE = {"huawei.com/vnpu-mode": "hami-core"}


def chip(word: str, memory: int, templates: Iterable[tuple[str, int]] = ()) -> VnpuChip:
    """A chip configured as Volcano's tests configure their 910 devices (allocatable = capacity)."""
    return VnpuChip(
        common_word=word,
        chip_name="",
        resource_name=f"huawei.com/{word}",
        resource_memory_name=f"huawei.com/{word}-memory",
        memory_allocatable=memory,
        memory_capacity=memory,
        ai_core=0,
        ai_cpu=0,
        templates=tuple(VnpuTemplate(name, size) for name, size in templates),
    )


def card(
    uuid: str,
    *,
    index: int = 0,
    count: int = 7,
    memory: int = 21527,
    cores: int = 8,
    used: tuple[int, int, int] = (0, 0, 0),
    hami_core: bool = False,
    health: bool = True,
) -> GpuState:
    """A registered chip with `used` = (cards' pods, MiB, cores) already on it."""
    return GpuState(
        index=index,
        uuid=uuid,
        type="Ascend310P",
        memory=memory,
        split_count=count,
        cores=cores,
        health=health,
        mode=HAMI_CORE if hami_core else TEMPLATE_MODE,
        used_num=used[0],
        used_memory=used[1],
        used_cores=used[2],
    )


def registration(*ids: str, health: bool = True, devcore: int = 8) -> str:
    """What the HAMi Ascend device plugin writes: Go's json.Marshal, `omitempty` on every field."""
    chips = []
    for index, uuid in enumerate(ids):
        entry: dict[str, Any] = {"id": uuid}
        if index:
            entry["index"] = index
        entry.update(count=7, devmem=21527, devcore=devcore, type="Ascend310P")
        if health:
            entry["health"] = True
        chips.append(entry)
    return json.dumps(chips, separators=(",", ":"))


def node(
    annotations: Mapping[str, str], allocatable: Mapping[str, Any] | None = None, name: str = "node-a"
) -> Obj:
    resources = {COUNT: "14"} if allocatable is None else dict(allocatable)
    return {
        "metadata": {"name": name, "annotations": dict(annotations)},
        "status": {"allocatable": resources},
    }


def npu_pod(
    name: str = "p",
    *limits: Mapping[str, Any],
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A pod with one container per `limits` (named c0, c1...)."""
    return pod(
        name, [container(f"c{i}", dict(given)) for i, given in enumerate(limits)], annotations=annotations
    )


CHIP = ASCEND310P
