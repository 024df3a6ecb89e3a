"""The GPU nodes of a simulated cluster, as the user shapes them: per node its sharing strategy, GPU
model, memory and count, and (vGPU) its sharing mode.

A node is a mapping, in a scenario's `nodes:` section or in a YAML file given to `--nodes`:

    nodes:
    - {name: a100-1, strategy: vgpu, model: NVIDIA A100-SXM4-80GB, memory: 81920, count: 8}
    - {strategy: share}                    # the defaults below

or one `--nodes` value of `key=value` pairs: `strategy=vgpu,model=NVIDIA A100-SXM4-80GB,count=8`.
Every GPU gets a UUID of its own, made from the node's name and the GPU's index, so no two nodes
share one and every run makes the same ones.

`memory-factor` (share and vgpu nodes, default 1) is the daemon's `--gpu-memory-factor`: memory
requests and annotations then count units of that many MiB. Kubelet takes at most 4 MiB of device
list per resource, one device per unit, so a node with much GPU memory needs one; a node that would
not fit is refused naming the smallest factor that does.

`mode` (vgpu nodes) is the daemon's `--vgpu-mode`: `hami-core` (the default), `mig` (dynamic MIG,
docs/mig.md): every GPU of a `mig` node is a fake card in MIG mode, so its model must be one dynamic
MIG has a profile table for (A100 40/80 GB, A30, H100 80 GB, H200 141 GB), and the daemon refuses
any other at start; or `mps` (docs/mps.md): the daemon runs one MPS control daemon per GPU, the
stand-in `deviceplugin/gpu/fake_mps_control.py` (`MPS_CONTROL`), under an MPS root of the node's.

`topology` names how the node's GPUs connect, one of the daemon's presets (`dgx-a100`,
`pcie-2socket`, `nvlink-pairs`; docs/topology.md): the daemon publishes it as
`volcano.sh/gpu-topology` (`--fake-gpu-topology`) and multi-GPU pods get the best-linked cards.
The node's `count` defaults to the preset's GPUs and must match them.

`super-node` puts the node in a super-node: its `volcano.sh/super-node` label, by which the
extender places the groups of a job with a GPU group size (docs/supernode.md).
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.fit import keys
from deviceplugin.fit.keys import STRATEGIES, Strategy
from deviceplugin.fit.supernode import SUPER_NODE_LABEL
from deviceplugin.gpu import mps
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.mig import MIG_MODELS, model_for
from deviceplugin.gpu.topology import PRESETS
from deviceplugin.plugin.devices import (
    MESSAGE_BUDGET,
    RESOURCES,
    FactorError,
    Layout,
    message_size,
    smallest_factor,
)

DEFAULT_MODEL = "Tesla T4"
#: Per strategy: GPU count and MiB per GPU when the node does not say.
DEFAULT_SHAPE: Mapping[Strategy, tuple[int, int]] = {
    "share": (2, 10989),
    "number": (4, 16384),
    "vgpu": (2, 16384),
    "whole": (4, 16384),
}
MAX_GPUS = 64  # what `--fake-gpus` takes
MAX_NODES = 16  # each node is a daemon process
#: Node names stay short: the kubelet socket paths below the node's directory must fit in 107 bytes.
MAX_NAME = 20
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_KEYS = ("name", "strategy", "count", "memory", "model", "mode", "memory-factor", "topology", "super-node")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
SPLIT_COUNT = 10  # the daemon's default --vgpu-split-count
_UUIDS = uuidlib.UUID("0c9a4c58-3f1e-4d0b-9d7e-5b2f8e61a7c3")
#: The control binary of an `mps` node's daemon: the product's stand-in for nvidia-cuda-mps-control.
MPS_CONTROL = str(Path(mps.__file__).with_name("fake_mps_control.py"))


class NodeSpecError(ValueError):
    """A node description that cannot be simulated; the message names the node and the field."""


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    model: str
    memory_mib: int


@dataclass(frozen=True)
class NodeSpec:
    name: str
    strategy: Strategy
    count: int = 2
    memory_mib: int = 16384
    model: str = DEFAULT_MODEL
    #: The vGPU sharing mode (vgpu nodes only): hami-core, mig or mps.
    mode: str | None = None
    #: MiB per memory unit (`--gpu-memory-factor`).
    memory_factor: int = 1
    #: The GPUs' interconnect: a preset of the daemon's (`--fake-gpu-topology`), or None.
    topology: str | None = None
    #: The node's super-node ("" when in none).
    super_node: str = ""

    @property
    def labels(self) -> dict[str, str]:
        """The labels the node's shape gives it beside kubelet's."""
        return {SUPER_NODE_LABEL: self.super_node} if self.super_node else {}

    @property
    def gpus(self) -> tuple[FakeGpu, ...]:
        return tuple(
            FakeGpu(
                index, f"GPU-{uuidlib.uuid5(_UUIDS, f'{self.name}/{index}')}", self.model, self.memory_mib
            )
            for index in range(self.count)
        )

    @property
    def shape(self) -> str:
        """`COUNT x MiB model`, for tables."""
        return f"{self.count}x{self.memory_mib} {self.model}"

    def write_fake_gpus(self, path: Path) -> Path:
        """The node's GPUs as a `--fake-gpus` JSON file."""
        mig = {"mig_enabled": True} if self.mode == keys.MODE_MIG else {}
        entries = [{"uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib, **mig} for g in self.gpus]
        path.write_text(json.dumps(entries, indent=1))
        return path

    def daemon_options(self, mps_root: Path) -> list[str]:
        """The daemon's options this node's shape adds: its GPUs' topology, a vgpu node's operating
        mode and, in mode mps, where its control daemons live (`mps_root`) and the stand-in
        control binary."""
        options = ["--fake-gpu-topology", self.topology] if self.topology else []
        if self.strategy != "vgpu" or not self.mode:
            return options
        options += ["--vgpu-mode", self.mode]
        if self.mode == keys.MODE_MPS:
            options += ["--mps-root", str(mps_root), "--mps-control", MPS_CONTROL]
        return options


def node(name: str, strategy: Strategy) -> NodeSpec:
    count, memory = DEFAULT_SHAPE[strategy]
    return NodeSpec(name, strategy, count, memory, mode=keys.MODE_HAMI_CORE if strategy == "vgpu" else None)


#: The demo's MIG node: one H100 80GB in MIG mode (its memory needs a factor to fit kubelet's message).
MIG_NODE = NodeSpec(
    "gpu-mig-1", "vgpu", 1, 81559, "NVIDIA H100 80GB HBM3", mode=keys.MODE_MIG, memory_factor=4
)
#: The demo's MPS node: one A10 shared through its MPS control daemon.
MPS_NODE = NodeSpec("gpu-mps-1", "vgpu", 1, 23028, "NVIDIA A10", mode=keys.MODE_MPS)
#: The demo's whole-GPU node: nvidia.com/gpu in place of NVIDIA's device plugin (docs/whole.md).
WHOLE_NODE = NodeSpec("gpu-whole-1", "whole", 4, 16384, topology="nvlink-pairs")
#: The cluster a scenario runs on unless it says otherwise: one node per Volcano strategy.
DEFAULT_NODES = (node("gpu-share-1", "share"), node("gpu-number-1", "number"), node("gpu-vgpu-1", "vgpu"))
#: The demo cluster: those, the MIG node and the MPS node (one node per vGPU mode), the whole node.
DEMO_NODES = (*DEFAULT_NODES, MIG_NODE, MPS_NODE, WHOLE_NODE)


# --- reading -------------------------------------------------------------------------------------


def parse_nodes(entries: object, where: str) -> tuple[NodeSpec, ...]:
    """A `nodes:` list; unnamed nodes are called `gpu-<strategy>-<n>`."""
    if not isinstance(entries, list) or not entries:
        raise NodeSpecError(f"{where}: nodes must be a non-empty list of node mappings")
    if len(entries) > MAX_NODES:
        raise NodeSpecError(f"{where}: {len(entries)} nodes; at most {MAX_NODES} can be simulated")
    specs: list[NodeSpec] = []
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise NodeSpecError(f"{where}: nodes[{number}] is not a mapping")
        specs.append(_spec(entry, f"{where}: nodes[{number}]", specs))
    return tuple(specs)


def parse_node_options(values: Sequence[str]) -> tuple[NodeSpec, ...]:
    """`--nodes` values: each a YAML file holding a `nodes:` list, or one node as `key=value,...`."""
    entries: list[object] = []
    for value in values:
        if "=" in value:
            entries.append(_pairs(value))
            continue
        try:
            document = yaml.safe_load(Path(value).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise NodeSpecError(
                f"--nodes {value}: neither key=value pairs nor a readable YAML file: {err}"
            ) from None
        if not isinstance(document, dict) or set(document) != {"nodes"}:
            raise NodeSpecError(f"--nodes {value}: the file must hold one mapping with a nodes: list")
        entries += document["nodes"] if isinstance(document["nodes"], list) else [document["nodes"]]
    return parse_nodes(entries, "--nodes")


def _pairs(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise NodeSpecError(f"--nodes {text!r}: {item!r} is not key=value")
        pairs[key.strip()] = value.strip()
    return pairs


def _spec(entry: Mapping[str, Any], where: str, before: Sequence[NodeSpec]) -> NodeSpec:
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise NodeSpecError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})")
    strategy = entry.get("strategy")
    if strategy not in STRATEGIES:
        raise NodeSpecError(f"{where}.strategy: {strategy!r} must be one of {', '.join(STRATEGIES)}")
    count, memory = DEFAULT_SHAPE[strategy]
    number = sum(spec.strategy == strategy for spec in before) + 1
    name = _name(entry.get("name", f"gpu-{strategy}-{number}"), f"{where}.name")
    if any(spec.name == name for spec in before):
        raise NodeSpecError(f"{where}.name: node {name} is given twice")
    topology = _topology(entry.get("topology"), f"{where}.topology")
    if topology is not None:
        count = len(PRESETS[topology]().gpus)
    spec = NodeSpec(
        name=name,
        strategy=strategy,
        count=_whole(entry.get("count", count), f"{where}.count", 1, MAX_GPUS),
        memory_mib=_whole(entry.get("memory", memory), f"{where}.memory", 1, 1 << 30),
        model=_model(entry.get("model", DEFAULT_MODEL), f"{where}.model"),
        mode=_mode(entry.get("mode"), strategy, f"{where}.mode"),
        memory_factor=_whole(entry.get("memory-factor", 1), f"{where}.memory-factor", 1, 1 << 20),
        topology=topology,
        super_node=_super_node(entry.get("super-node", ""), f"{where}.super-node"),
    )
    if topology is not None and spec.count != count:
        raise NodeSpecError(
            f"{where}.topology: {topology} describes {count} GPUs; the node has count {spec.count} "
            f"(leave count out, or give {count})"
        )
    _check_factor(spec, where)
    if spec.mode == keys.MODE_MIG and model_for(spec.model, spec.memory_mib) is None:
        supported = ", ".join(model.key for model in MIG_MODELS)
        raise NodeSpecError(
            f"{where}.model: {spec.model!r} ({spec.memory_mib} MiB) has no MIG profile table; a mig node's "
            f"model must be one of {supported} (e.g. NVIDIA H100 80GB HBM3, memory 81559)"
        )
    return spec


def _check_factor(spec: NodeSpec, where: str) -> None:
    """The daemon would refuse to start: say so now, in the node's terms."""
    if not any(resource.memory_based for resource in RESOURCES[spec.strategy]):
        if spec.memory_factor != 1:
            raise NodeSpecError(
                f"{where}.memory-factor: {spec.strategy} nodes advertise whole GPUs, not memory"
            )
        return
    gpus = [GpuInfo(g.index, g.uuid, g.model, g.memory_mib) for g in spec.gpus]
    resources = RESOURCES[spec.strategy]
    layout = Layout(spec.memory_factor, SPLIT_COUNT)
    if spec.memory_factor > spec.memory_mib:
        raise NodeSpecError(
            f"{where}.memory-factor: {spec.memory_factor} is more than a GPU's {spec.memory_mib} MiB"
        )
    if all(message_size(resource, gpus, layout) <= MESSAGE_BUDGET for resource in resources):
        return
    try:
        fitting = smallest_factor(resources, gpus, SPLIT_COUNT)
    except FactorError as err:
        raise NodeSpecError(f"{where}: {err}") from None
    raise NodeSpecError(
        f"{where}: {spec.count} GPUs of {spec.memory_mib} MiB advertise more memory devices than kubelet "
        f"takes at memory-factor {spec.memory_factor}; give memory-factor: {fitting} or more (memory "
        f"requests and annotations then count units of that many MiB)"
    )


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > MAX_NAME:
        raise NodeSpecError(
            f"{where}: {value!r} must be a lowercase DNS label (a-z, 0-9, '-') of at most {MAX_NAME} "
            "characters (the node's socket paths must stay short)"
        )
    return value


def _whole(value: object, where: str, low: int, high: int) -> int:
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise NodeSpecError(f"{where}: {value!r} must be a whole number from {low} to {high}")
    return int(text)


def _super_node(value: object, where: str) -> str:
    if value == "":
        return ""
    if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
        raise NodeSpecError(
            f"{where}: {value!r} must be a label value (letters, digits, '-', '_', '.', at most 63)"
        )
    return value


def _model(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or any(c in value for c in ",:;"):
        raise NodeSpecError(f"{where}: {value!r} must be a non-empty name free of ',', ':' and ';'")
    return value.strip()


def _topology(value: object, where: str) -> str | None:
    if value is None or (isinstance(value, str) and value in PRESETS):
        return value
    raise NodeSpecError(f"{where}: {value!r} must be one of {', '.join(PRESETS)}")


def _mode(value: object, strategy: Strategy, where: str) -> str | None:
    if strategy != "vgpu":
        if value is not None:
            raise NodeSpecError(f"{where}: only vgpu nodes have a sharing mode; this is a {strategy} node")
        return None
    if value is None:
        return keys.MODE_HAMI_CORE
    if isinstance(value, str) and value in keys.SHARING_MODES:
        return value
    raise NodeSpecError(f"{where}: {value!r} must be one of {', '.join(keys.SHARING_MODES)}")
