"""The HAMi vGPU plugin's ConfigMaps (Project-HAMi/volcano-vgpu-device-plugin), read from the files
they are mounted as:

* `volcano-vgpu-device-config`, key `device-config.yaml`: its `nvidia:` section (Volcano's
  scheduler reads the same ConfigMap); gopkg.in/yaml.v2 rules, so names match exactly;
* `volcano-vgpu-node-config`, key `config.json`: `nodeconfig: [...]`, whose entry named after this
  node overrides the former; encoding/json rules, so names match regardless of case, and a zero
  or empty value means "not set" as it does there.

Every field becomes a daemon option, is accepted with a note saying why a node plugin has nothing
to do for it, or is refused with its name. `operatingmode` (`hami-core`; `mig`, dynamic MIG,
docs/mig.md; `mps`, docs/mps.md) and `knownMigGeometries` become `--vgpu-mode` and
`--vgpu-mig-geometries`; NVIDIA's static MIG resources (`migstrategy`) are not run by this plugin
yet and are refused on the node that asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceplugin.configfile import read_mapping
from deviceplugin.fit import jsontext, keys
from deviceplugin.fit.model import MigGeometry, MigGroup, MigInstance
from deviceplugin.upstream.fields import (
    Reading,
    Setting,
    UpstreamError,
    field_path,
    fields,
    flag,
    items,
    number,
    text,
    whole,
)

DEVICE_CONFIG_MAP, DEVICE_CONFIG_KEY = "volcano-vgpu-device-config", "device-config.yaml"
NODE_CONFIG_MAP, NODE_CONFIG_KEY = "volcano-vgpu-node-config", "config.json"

# device-config.yaml: nvidia.<field> -> the daemon option it sets
NVIDIA_OPTIONS = {
    "deviceSplitCount": "vgpu-split-count",
    "deviceMemoryScaling": "vgpu-memory-scaling",
    "deviceCoreScaling": "vgpu-core-scaling",
    "disableCoreLimit": "vgpu-disable-core-limit",
    "gpuMemoryFactor": "gpu-memory-factor",
}
# The names Volcano's scheduler looks for on a node (it does not read these fields for that).
RESOURCE_NAMES = {
    "resourceCountName": keys.VGPU_NUMBER,
    "resourceMemoryName": keys.VGPU_MEMORY,
    "resourceCoreName": keys.VGPU_CORES,
}


@dataclass(frozen=True, slots=True)
class Inert:
    """A field nothing under Volcano acts on (neither its scheduler nor a node plugin): accepted
    at the value that asks for nothing, refused at any other."""

    check: Callable[[object, str], object]
    value: object
    refusal: str


INERT = {
    "overwriteEnv": Inert(
        flag, False, "Volcano has no admission step that hides GPUs from containers without a request"
    ),
    "defaultMemory": Inert(
        whole, 0, f"Volcano gives no default memory to a container; ask for {keys.VGPU_MEMORY} in the pod"
    ),
    "defaultCores": Inert(
        whole, 0, f"Volcano gives no default cores to a container; ask for {keys.VGPU_CORES} in the pod"
    ),
    "defaultGPUNum": Inert(
        whole, 1, f"Volcano gives a container that asks {keys.VGPU_MEMORY} alone one GPU, no other number"
    ),
    "passDeviceSpecs": Inert(
        flag, False, "this plugin leaves the GPU device nodes to the NVIDIA container runtime"
    ),
    "resourcePriorityName": Inert(text, "", "no task priority reaches HAMi-core under Volcano"),
}
NVIDIA_FIELDS = (
    *NVIDIA_OPTIONS,
    *RESOURCE_NAMES,
    *INERT,
    "resourceMemoryPercentageName",
    "knownMigGeometries",
)

NODE_FIELDS = (
    "name",
    "operatingmode",
    "devicememoryscaling",
    "devicecorescaling",
    "devicesplitcount",
    "migstrategy",
    "filterdevices",
)
MIG_STRATEGIES = ("none", "single", "mixed")


def _positive(value: object, where: str) -> float:
    scaling = number(value, where)
    if scaling <= 0:
        raise UpstreamError(f"{where}: must be above 0, got {value!r}")
    return scaling


def _group(value: object, where: str) -> MigGroup:
    shape = fields(value, where, ("group", "geometries"), fold_case=False)
    instances = []
    for k, instance in enumerate(items(shape.get("geometries"), f"{where}.geometries")):
        at = field_path(f"{where}.geometries", k)
        sizes = fields(instance, at, ("name", "memory", "count"), fold_case=False)
        instances.append(
            MigInstance(
                text(sizes.get("name"), f"{at}.name"),
                whole(sizes.get("memory"), f"{at}.memory", minimum=1),
                whole(sizes.get("count"), f"{at}.count", minimum=1),
            )
        )
    return MigGroup(text(shape.get("group"), f"{where}.group"), tuple(instances))


def mig_geometries(value: object, where: str = "knownMigGeometries") -> tuple[MigGeometry, ...]:
    """`knownMigGeometries` (models, allowedGeometries: group, geometries: name, memory, count)
    as the fit library's geometries; UpstreamError names the first field out of shape."""
    geometries = []
    for i, entry in enumerate(items(value, where)):
        at = field_path(where, i)
        known = fields(entry, at, ("models", "allowedGeometries"), fold_case=False)
        names = items(known.get("models"), f"{at}.models")
        models = tuple(text(model, field_path(f"{at}.models", j)) for j, model in enumerate(names))
        groups = tuple(
            _group(group, field_path(f"{at}.allowedGeometries", j))
            for j, group in enumerate(items(known.get("allowedGeometries"), f"{at}.allowedGeometries"))
        )
        geometries.append(MigGeometry(models, groups))
    return tuple(geometries)


def read_device_config(path: Path) -> Reading:
    """The options `device-config.yaml` sets; UpstreamError names the first field it cannot honour."""
    try:
        loaded = read_mapping(path)
    except ValueError as err:
        raise UpstreamError(str(err)) from None
    top = fields(loaded, "", ("nvidia", "vnpus"), fold_case=False)
    notes = []
    if "vnpus" in top:
        notes.append("vnpus: Volcano's Ascend vNPU section; not for this NVIDIA plugin")
    nvidia = fields(top.get("nvidia"), "nvidia", NVIDIA_FIELDS, fold_case=False)
    settings: dict[str, Setting] = {}
    for name, value in nvidia.items():
        where = f"nvidia.{name}"
        if name in ("deviceSplitCount", "gpuMemoryFactor"):
            settings[NVIDIA_OPTIONS[name]] = (whole(value, where, minimum=1), where)
        elif name in ("deviceMemoryScaling", "deviceCoreScaling"):
            settings[NVIDIA_OPTIONS[name]] = (_positive(value, where), where)
        elif name == "disableCoreLimit":
            settings[NVIDIA_OPTIONS[name]] = (flag(value, where), where)
        elif name in RESOURCE_NAMES:
            if text(value, where) != RESOURCE_NAMES[name]:
                raise UpstreamError(
                    f"{where}: {value!r} is not supported: this plugin serves {RESOURCE_NAMES[name]}, the "
                    "name Volcano's scheduler looks for on a node"
                )
        elif name in INERT:
            inert = INERT[name]
            if inert.check(value, where) != inert.value:
                raise UpstreamError(f"{where}: {value!r} is not supported: {inert.refusal}")
        elif name == "resourceMemoryPercentageName":
            text(value, where)
            notes.append(f"{where}: read by Volcano's scheduler (a pod's memory-percentage request)")
        else:
            models = len(mig_geometries(value, where))
            settings["vgpu-mig-geometries"] = (value, where)
            notes.append(f"{where}: {models} model(s) checked; read by Volcano's scheduler and a mig node")
    inert_given = sorted(name for name in nvidia if name in INERT)
    if inert_given:
        notes.append(f"nvidia.{', '.join(inert_given)}: at the values that ask nothing of a node plugin")
    return Reading(settings, tuple(notes))


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """One `nodeconfig` entry, checked; zero or empty values are unset, as upstream."""

    where: str
    name: str
    mode: str
    mig_strategy: str
    settings: dict[str, Setting]


def _node_entry(value: object, where: str) -> NodeEntry:
    # null, like an absent field, leaves Go's zero value
    given = {
        name: item
        for name, item in fields(value, where, NODE_FIELDS, fold_case=True).items()
        if item is not None
    }
    name = text(given.get("name", ""), f"{where}.name")
    if not name:
        raise UpstreamError(f"{where}.name: must name a node")
    mode = text(given.get("operatingmode", ""), f"{where}.operatingmode")
    if mode not in ("", *keys.SHARING_MODES):
        raise UpstreamError(f"{where}.operatingmode: {mode!r} must be one of {', '.join(keys.SHARING_MODES)}")
    mig_strategy = text(given.get("migstrategy", ""), f"{where}.migstrategy")
    if mig_strategy not in ("", *MIG_STRATEGIES):
        raise UpstreamError(
            f"{where}.migstrategy: {mig_strategy!r} must be one of {', '.join(MIG_STRATEGIES)}"
        )
    settings: dict[str, Setting] = {}
    for field, option in (
        ("devicememoryscaling", "vgpu-memory-scaling"),
        ("devicecorescaling", "vgpu-core-scaling"),
    ):
        at = f"{where}.{field}"
        scaling = number(given.get(field, 0), at)
        if scaling < 0:
            raise UpstreamError(f"{at}: must be above 0 (or 0 for unset), got {scaling!r}")
        if scaling > 0:
            settings[option] = (scaling, at)
    at = f"{where}.devicesplitcount"
    split_count = whole(given.get("devicesplitcount", 0), at)
    if split_count:
        settings["vgpu-split-count"] = (split_count, at)
    at = f"{where}.filterdevices"
    devices = fields(given.get("filterdevices"), at, ("uuid", "index"), fold_case=True)
    excluded: list[str] = []
    for i, uuid in enumerate(items(devices.get("uuid"), f"{at}.uuid")):
        if not text(uuid, field_path(f"{at}.uuid", i)).startswith("GPU-") or "," in uuid:
            raise UpstreamError(f"{field_path(f'{at}.uuid', i)}: {uuid!r} is not a GPU UUID (GPU-…)")
        excluded.append(uuid)
    for i, index in enumerate(items(devices.get("index"), f"{at}.index")):
        excluded.append(str(whole(index, field_path(f"{at}.index", i))))
    if excluded:
        settings["exclude-gpus"] = (",".join(excluded), at)
    return NodeEntry(where, name, mode, mig_strategy, settings)


def _read_json(path: Path) -> Any:
    try:
        return jsontext.loads(path.read_text())
    except OSError as err:
        raise UpstreamError(f"cannot read it: {err.strerror or err}") from None
    except ValueError as err:
        raise UpstreamError(f"not valid JSON: {err}") from None


def read_node_config(path: Path, node_name: str) -> Reading:
    """The options `config.json`'s entry for `node_name` sets (none without an entry). Every entry
    is checked, so one file is good or bad on every node alike; what this plugin does not run is
    refused only on the node whose entry asks for it."""
    top = fields(_read_json(path), "", ("nodeconfig",), fold_case=True)
    entries = [
        _node_entry(entry, field_path("nodeconfig", i))
        for i, entry in enumerate(items(top.get("nodeconfig"), "nodeconfig"))
    ]
    seen: dict[str, str] = {}
    for entry in entries:
        if entry.name in seen:
            raise UpstreamError(f"{entry.where}.name: {entry.name!r} is also the name of {seen[entry.name]}")
        seen[entry.name] = entry.where
    mine = [entry for entry in entries if entry.name == node_name]
    if not mine:
        return Reading(
            {}, (f"no nodeconfig entry names node {node_name}: device-config.yaml and the defaults apply",)
        )
    (entry,) = mine
    settings = dict(entry.settings)
    if entry.mode:
        settings["vgpu-mode"] = (entry.mode, f"{entry.where}.operatingmode")
    if entry.mig_strategy not in ("", "none"):
        raise UpstreamError(
            f"{entry.where}.migstrategy: {entry.mig_strategy!r} is not supported yet: this plugin does not "
            "expose NVIDIA's static MIG resources (none only; operatingmode mig partitions cards per pod)"
        )
    return Reading(settings, (f"{entry.where} applies to node {node_name}",))
