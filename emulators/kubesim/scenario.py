"""`simulate --scenario FILE`: what a YAML file of Kubernetes and Volcano objects asks the simulated
cluster to do.

Each document (or each item of a `kind: List`) is one of:

- a `Pod`, a `Deployment` or `ReplicaSet`, a Volcano `Job` or `PodGroup` (`workloads` expands them
  into pods and gangs);
- Volcano's scheduler ConfigMap `volcano-scheduler-configmap`: its `deviceshare` arguments
  `SchedulePolicy` and `ScheduleWeight` set the extenders' policy and weight, a `gpu-aware`
  plugin's arguments `weight` and `loss.weight` their gpu-aware score's weights
  (docs/gpu-aware.md); the rest of the scheduler configuration is listed as not simulated;
- a Volcano `Queue`, or any other ConfigMap: accepted, listed as not simulated;
- a mapping with only `nodes:`, the cluster to simulate (`nodes.parse_nodes`).

Anything else is an error naming the document, as is a field no simulation can take.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.extender.config import (
    GPU_AWARE,
    GPU_AWARE_KEYS,
    POLICIES,
    VOLCANO_POLICY,
    VOLCANO_WEIGHT,
    ExtenderConfigError,
    Policy,
    load_config,
)
from deviceplugin.fit import keys
from deviceplugin.fit.fragment import Weights
from kubesim import workloads
from kubesim.nodes import NodeSpec, NodeSpecError, parse_nodes
from kubesim.workloads import VOLCANO_BATCH, VOLCANO_SCHEDULING, Gang, Obj, ScenarioError

SCHEDULER_CONFIGMAP = "volcano-scheduler-configmap"
SCHEDULER_CONF_KEY = "volcano-scheduler.conf"
# The gpu-aware plugin's arguments (GPU_AWARE_KEYS) by the Weights field each sets.
_WEIGHTS = {"weight": "weight", "loss.weight": "loss_weight"}
GPU_AWARE_OFF = Weights()  # no gpu-aware plugin in the file: the extenders' default
ACCEPTED = (
    "Pod, List, Deployment, ReplicaSet (apps/v1), Job (batch.volcano.sh/v1alpha1), PodGroup and Queue "
    "(scheduling.volcano.sh/v1beta1), ConfigMap, or a mapping with only nodes:"
)


@dataclass(frozen=True)
class Scenario:
    title: str
    pods: tuple[Obj, ...]
    gangs: tuple[Gang, ...] = ()
    #: The cluster the file asks for; None: the caller's (the demo cluster unless `--nodes`).
    nodes: tuple[NodeSpec, ...] | None = None
    policy: Policy | None = None
    weight: int | None = None
    #: The gpu-aware plugin's `weight` and `loss.weight`: the GPU extenders' gpu-aware score (both 0: off).
    gpu_aware: Weights = GPU_AWARE_OFF
    #: What the file holds that the simulation accepts without playing it, one line each.
    not_simulated: tuple[str, ...] = ()


@dataclass
class _Reading:
    path: Path
    pods: list[Obj] = field(default_factory=list)
    gangs: list[Gang] = field(default_factory=list)
    nodes: tuple[NodeSpec, ...] | None = None
    policy: Policy | None = None
    weight: int | None = None
    gpu_aware: Weights = field(default_factory=Weights)
    not_simulated: list[str] = field(default_factory=list)


def read_scenario(path: Path) -> Scenario:
    """The scenario in `path`; `ScenarioError` naming the document and field when it cannot be played."""
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except (OSError, UnicodeDecodeError) as err:
        raise ScenarioError(f"--scenario {path}: {err}") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"--scenario {path}: not YAML: {_yaml_error(err)}") from None
    reading = _Reading(path)
    for number, document in enumerate(documents, start=1):
        if document is not None:
            _add(reading, document, f"{path} document {number}")
    if not reading.pods:
        raise ScenarioError(f"--scenario {path}: no pods in the file (it takes {ACCEPTED})")
    if len(reading.pods) > workloads.MAX_PODS:
        raise ScenarioError(f"--scenario {path}: {len(reading.pods)} pods; at most {workloads.MAX_PODS}")
    _check_unique(reading.pods, path)
    return Scenario(
        title=f"scenario {path.name}",
        pods=tuple(reading.pods),
        gangs=_with_members(reading),
        nodes=reading.nodes,
        policy=reading.policy,
        weight=reading.weight,
        gpu_aware=reading.gpu_aware,
        not_simulated=tuple(reading.not_simulated),
    )


def _yaml_error(err: yaml.YAMLError) -> str:
    """One line: where, and what the parser found."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
    return " ".join(str(err).split())


def _add(reading: _Reading, document: object, where: str) -> None:
    if not isinstance(document, dict):
        raise ScenarioError(f"{where}: not a mapping (it takes {ACCEPTED})")
    kind, api = document.get("kind"), document.get("apiVersion")
    if kind is None and "nodes" in document:
        _nodes(reading, document, where)
    elif kind == "List":
        items = document.get("items") or []
        if not isinstance(items, list):
            raise ScenarioError(f"{where}.items must be a list")
        for number, item in enumerate(items):
            _add(reading, item, f"{where} items[{number}]")
    elif kind == "Pod":
        reading.pods.append(workloads.pod(document, where))
    elif kind in ("Deployment", "ReplicaSet") and api == "apps/v1":
        reading.pods += workloads.replica_pods(document, where).pods
    elif kind == "Job" and api == VOLCANO_BATCH:
        expanded = workloads.volcano_job(document, where)
        reading.pods += expanded.pods
        reading.gangs += expanded.gangs
        reading.not_simulated += expanded.not_simulated
    elif kind == "PodGroup" and api == VOLCANO_SCHEDULING:
        gang, notes = workloads.pod_group(document, where)
        reading.gangs.append(gang)
        reading.not_simulated += notes
    elif kind == "Queue" and api == VOLCANO_SCHEDULING:
        reading.not_simulated.append(f"Queue {_name_of(document)}: queues and their capacity")
    elif kind == "ConfigMap":
        _configmap(reading, document, where)
    else:
        raise ScenarioError(
            f"{where}: apiVersion {api!r} kind {kind!r} is not simulated (it takes {ACCEPTED})"
        )


def _name_of(document: Obj) -> str:
    meta = document.get("metadata") or {}
    return str(meta.get("name") or "?") if isinstance(meta, dict) else "?"


def _nodes(reading: _Reading, document: Obj, where: str) -> None:
    if set(document) != {"nodes"}:
        raise ScenarioError(
            f"{where}: a nodes section holds nodes: only, not {sorted(set(document) - {'nodes'})}"
        )
    if reading.nodes is not None:
        raise ScenarioError(f"{where}: a second nodes section (give the cluster once)")
    try:
        reading.nodes = parse_nodes(document["nodes"], where)
    except NodeSpecError as err:
        raise ScenarioError(str(err)) from None


def _configmap(reading: _Reading, document: Obj, where: str) -> None:
    name = _name_of(document)
    data = document.get("data") or {}
    if name != SCHEDULER_CONFIGMAP or not isinstance(data, dict) or SCHEDULER_CONF_KEY not in data:
        reading.not_simulated.append(f"ConfigMap {name}")
        return
    try:
        conf = yaml.safe_load(str(data[SCHEDULER_CONF_KEY])) or {}
    except yaml.YAMLError as err:
        raise ScenarioError(f"{where}: data.{SCHEDULER_CONF_KEY}: {err}") from None
    if not isinstance(conf, dict):
        raise ScenarioError(f"{where}: data.{SCHEDULER_CONF_KEY} must be a YAML mapping")
    shown = f"ConfigMap {name}"
    if "actions" in conf:
        reading.not_simulated.append(f"{shown}: actions {conf['actions']!r}")
    for tier_number, tier in enumerate(conf.get("tiers") or []):
        for plugin in (tier or {}).get("plugins") or []:
            _plugin(reading, plugin, f"{where}: tiers[{tier_number}]", shown)


def _plugin(reading: _Reading, plugin: object, where: str, shown: str) -> None:
    if not isinstance(plugin, dict) or not plugin.get("name"):
        raise ScenarioError(f"{where}: every plugin needs a name")
    name, arguments = plugin["name"], plugin.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise ScenarioError(f"{where} {name}.arguments must be a mapping")
    if name == GPU_AWARE:
        _gpu_aware(reading, arguments, where, shown)
        return
    if name != "deviceshare":
        reading.not_simulated.append(f"{shown}: plugin {name}" + (f" {arguments}" if arguments else ""))
        return
    for key, value in arguments.items():
        at = f"{where} deviceshare.arguments {key}"
        if key == VOLCANO_POLICY:
            if value not in POLICIES:
                raise ScenarioError(f"{at}: {value!r} must be one of {', '.join(POLICIES)}")
            reading.policy = value
        elif key == VOLCANO_WEIGHT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ScenarioError(f"{at}: {value!r} must be a whole number")
            reading.weight = value
        else:
            written = json.dumps(value) if isinstance(value, bool) else value  # as the YAML wrote it
            reading.not_simulated.append(
                f"{shown}: {key}: {written} (every strategy the simulated nodes run is scheduled)"
            )


def _gpu_aware(reading: _Reading, arguments: dict[str, Any], where: str, shown: str) -> None:
    """The gpu-aware plugin's `weight` and `loss.weight`, read as the extender reads its options."""
    for key, value in arguments.items():
        option = GPU_AWARE_KEYS.get(key)
        if option is None:
            reading.not_simulated.append(f"{shown}: {GPU_AWARE} argument {key}: {value}")
            continue
        at = f"{where} {GPU_AWARE}.arguments {key}"
        if value is None:
            raise ScenarioError(f"{at}: no value; it takes a number from 0 (off)")
        try:
            config = load_config({option: value}, env={})
        except ExtenderConfigError as err:
            raise ScenarioError(f"{at}: {err}") from None
        number = getattr(config, option.replace("-", "_"))
        reading.gpu_aware = replace(reading.gpu_aware, **{_WEIGHTS[key]: number})


def _check_unique(pods: list[Obj], path: Path) -> None:
    seen: set[str] = set()
    for pod in pods:
        meta = pod["metadata"]
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        if key in seen:
            raise ScenarioError(f"--scenario {path}: pod {key} is defined twice")
        seen.add(key)


def _with_members(reading: _Reading) -> tuple[Gang, ...]:
    """Standalone PodGroups get the pods that name them, in file order."""
    gangs = []
    for gang in reading.gangs:
        if gang.pods:
            gangs.append(gang)
            continue
        members = tuple(
            pod["metadata"]["name"]
            for pod in reading.pods
            if (pod["metadata"].get("namespace") or "default") == gang.namespace
            and gang.name in _group_names(pod)
        )
        if not members:
            raise ScenarioError(f"--scenario {reading.path}: {gang.source}: no pod names it")
        gangs.append(replace(gang, pods=members))
    return tuple(gangs)


def _group_names(pod: Obj) -> set[str]:
    notes: dict[str, Any] = pod["metadata"].get("annotations") or {}
    return {str(notes[key]) for key in (keys.KUBE_GROUP_NAME, keys.VOLCANO_GROUP_NAME) if key in notes}
