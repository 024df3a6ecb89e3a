"""Workloads of a scenario expanded into the pods their controllers would create.

- `Pod`: as written (validated: a name, containers with names).
- `Deployment` / `ReplicaSet` (apps/v1): `replicas` pods from the template, named as the controllers
  name them (`<deployment>-<template hash>-<5 characters>`, `<replicaset>-<5 characters>`), made
  deterministic here so every run names them alike.
- Volcano `Job` (batch.volcano.sh/v1alpha1): what Volcano's job controller creates (its
  `createJobPod`, with the admission webhook's defaults): per task, `replicas` pods named
  `<job>-<task>-<index>` with the job/task annotations and labels, all in the pod group
  `<job>-<job uid>` whose `minMember` is the Job's `minAvailable` (default: the sum of the tasks'
  `minAvailable`, each defaulting to its `replicas`).
- `PodGroup` (scheduling.volcano.sh/v1beta1): a gang of the pods that name it.

What the simulation does not play (queues, job plugins, policies, ...) is accepted and listed as
not simulated.
"""

from __future__ import annotations

import copy
import json
import re
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.fit import keys

Obj = dict[str, Any]

VOLCANO_BATCH = "batch.volcano.sh/v1alpha1"
VOLCANO_SCHEDULING = "scheduling.volcano.sh/v1beta1"
DEFAULT_QUEUE = "default"
DEFAULT_SCHEDULER = "volcano"  # the Job webhook's default schedulerName
MAX_PODS = 500  # one scenario; each pod is scheduled and admitted for real
# Volcano's job/task keys (volcano.sh/apis batch/v1alpha1 labels.go).
TASK_SPEC = "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"
JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
QUEUE_NAME = "volcano.sh/queue-name"
JOB_VERSION = "volcano.sh/job-version"
TEMPLATE_UID = "volcano.sh/template-uid"
JOB_RETRY_COUNT = "volcano.sh/job-retry-count"
POD_TEMPLATE_HASH = "pod-template-hash"

# Job fields the simulation plays, and those it accepts without playing them.
_JOB_PLAYED = ("minAvailable", "schedulerName", "tasks")
_JOB_NOT_PLAYED = (
    "queue",
    "plugins",
    "policies",
    "maxRetry",
    "ttlSecondsAfterFinished",
    "priorityClassName",
    "volumes",
    "networkTopology",
    "minSuccess",
    "runningEstimate",
)
_GROUP_NOT_PLAYED = (
    "queue",
    "minResources",
    "minTaskMember",
    "priorityClassName",
    "networkTopology",
    "subGroupPolicy",
)
_TASK_PLAYED = ("name", "replicas", "template", "minAvailable")
_TASK_NOT_PLAYED = ("policies", "topologyPolicy", "maxRetry", "dependsOn", "partitionPolicy")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# What kube's rand.SafeEncodeString and generateName suffixes draw from: no vowels, no look-alikes.
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"
_JOB_UIDS = uuidlib.UUID("a3d2c1f0-6b5e-4c7d-8e9f-0a1b2c3d4e5f")


class ScenarioError(ValueError):
    """A scenario document that cannot be simulated; the message names the document and field."""


@dataclass(frozen=True)
class Gang:
    """Pods scheduled all or nothing: none is bound unless `min_member` of them can be placed
    (and, when `min_member` covers them, each task's own minimum)."""

    namespace: str
    name: str  # the PodGroup's
    min_member: int
    pods: tuple[str, ...]  # member names, in the order they are tried
    source: str  # what made it: "Job ns/name" or "PodGroup ns/name"
    task_of: Mapping[str, str] = field(default_factory=dict)  # pod -> Volcano task
    task_min: Mapping[str, int] = field(default_factory=dict)  # task -> its minAvailable
    queue: str = DEFAULT_QUEUE

    def podgroup(self, running: int) -> Obj:
        """The PodGroup object Volcano's job controller creates, with the phase its scheduler gives
        it once `running` members run (Running when minMember do, else Pending)."""
        spec: Obj = {"minMember": self.min_member, "queue": self.queue}
        if self.task_min:
            spec["minTaskMember"] = dict(self.task_min)
        phase = "Running" if running >= self.min_member else "Pending"
        return {
            "apiVersion": VOLCANO_SCHEDULING,
            "kind": "PodGroup",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
            "status": {"phase": phase, "running": running},
        }


@dataclass
class Expanded:
    """What one document stands for."""

    pods: list[Obj] = field(default_factory=list)
    gangs: list[Gang] = field(default_factory=list)
    not_simulated: list[str] = field(default_factory=list)


# --- pods ----------------------------------------------------------------------------------------


def _mapping(value: object, where: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{where} must be a mapping")
    return value


def _name(value: object, where: str, pattern: re.Pattern[str] = _DNS_SUBDOMAIN, longest: int = 253) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or len(value) > longest:
        raise ScenarioError(
            f"{where}: {value!r} is not a valid name (lowercase a-z, 0-9, '-', at most {longest})"
        )
    return value


def _count(value: object, where: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(f"{where}: {value!r} must be a whole number of at least 0")
    return value


def _strings(value: object, where: str) -> dict[str, str]:
    mapping = _mapping(value, where)
    return {str(k): str(v) for k, v in mapping.items()}


def _quantities(resources: Obj, where: str) -> Obj:
    """Resource quantities as the API server stores them: strings (YAML reads `1024` as a number)."""
    out = dict(resources)
    for section in ("limits", "requests"):
        values = _mapping(resources.get(section), f"{where}.{section}")
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ScenarioError(f"{where}.{section}.{name}: {value!r} is not a quantity")
        if values:
            out[section] = {name: str(value) for name, value in values.items()}
    return out


def _pod_spec(spec: object, where: str) -> Obj:
    spec = copy.deepcopy(_mapping(spec, where))
    for group in ("initContainers", "containers"):
        listed = spec.get(group) or []
        if not isinstance(listed, list) or (group == "containers" and not listed):
            raise ScenarioError(f"{where}.{group} must be a non-empty list of containers")
        for number, container in enumerate(listed):
            at = f"{where}.{group}[{number}]"
            if not isinstance(container, dict):
                raise ScenarioError(f"{at} must be a mapping")
            _name(container.get("name"), f"{at}.name", _DNS_LABEL, 63)
            container["resources"] = _quantities(_mapping(container.get("resources"), f"{at}.resources"), at)
    names = [c["name"] for group in ("initContainers", "containers") for c in spec.get(group) or []]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{where}: container names must be unique, got {names}")
    return spec


def pod(document: Obj, where: str) -> Obj:
    meta = _mapping(document.get("metadata"), f"{where}.metadata")
    _name(meta.get("name"), f"{where}.metadata.name")
    if "namespace" in meta:
        _name(meta["namespace"], f"{where}.metadata.namespace", _DNS_LABEL, 63)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": copy.deepcopy(meta),
        "spec": _pod_spec(document.get("spec"), f"{where}.spec"),
    }


def _from_template(template: Obj, name: str, namespace: str, where: str) -> Obj:
    meta = _mapping(template.get("metadata"), f"{where}.metadata")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": _strings(meta.get("labels"), f"{where}.metadata.labels"),
            "annotations": _strings(meta.get("annotations"), f"{where}.metadata.annotations"),
        },
        "spec": _pod_spec(template.get("spec"), f"{where}.spec"),
    }


# --- Deployments and ReplicaSets -------------------------------------------------------------------


def _fnv32a(text: str) -> int:
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _safe_encoded(text: str) -> str:
    """kube's rand.SafeEncodeString: each byte mapped onto the alphabet (a template hash's digits)."""
    return "".join(_ALPHANUMS[ord(c) % len(_ALPHANUMS)] for c in text)


def _suffix(seed: str) -> str:
    """The 5 characters generateName would add, drawn from `seed` instead of at random."""
    return "".join(_ALPHANUMS[_fnv32a(f"{seed}/{i}") % len(_ALPHANUMS)] for i in range(5))


def replica_pods(document: Obj, where: str) -> Expanded:
    """A Deployment's or ReplicaSet's pods (each scheduled on its own)."""
    kind = document["kind"]
    meta = _mapping(document.get("metadata"), f"{where}.metadata")
    name = _name(meta.get("name"), f"{where}.metadata.name")
    namespace = str(meta.get("namespace") or "default")
    spec = _mapping(document.get("spec"), f"{where}.spec")
    replicas = _count(spec.get("replicas"), f"{where}.spec.replicas", 1)
    template = _mapping(spec.get("template"), f"{where}.spec.template")
    labels = _strings(
        _mapping(template.get("metadata"), f"{where}.spec.template.metadata").get("labels"), where
    )
    selector = _strings(_mapping(spec.get("selector"), f"{where}.spec.selector").get("matchLabels"), where)
    if not selector or not selector.items() <= labels.items():
        raise ScenarioError(
            f"{where}.spec.selector.matchLabels must be non-empty and match spec.template.metadata.labels"
        )
    owner = name
    extra: dict[str, str] = {}
    if kind == "Deployment":
        template_hash = _safe_encoded(str(_fnv32a(json.dumps(template, sort_keys=True))))
        owner = f"{name}-{template_hash}"
        extra = {POD_TEMPLATE_HASH: template_hash}
    pods = []
    for index in range(replicas):
        made = _from_template(
            template, f"{owner}-{_suffix(f'{owner}/{index}')}", namespace, f"{where}.spec.template"
        )
        made["metadata"]["labels"] |= extra
        pods.append(made)
    return Expanded(pods=pods)


# --- Volcano Jobs and PodGroups --------------------------------------------------------------------


def _known(section: Obj, played: Sequence[str], not_played: Sequence[str], where: str) -> list[str]:
    """Fields present that the simulation does not play; unknown fields are errors (typos would
    otherwise change the outcome silently)."""
    unknown = sorted(set(section) - set(played) - set(not_played))
    if unknown:
        raise ScenarioError(
            f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join([*played, *not_played])})"
        )
    return [key for key in not_played if key in section]


def volcano_job(document: Obj, where: str) -> Expanded:
    meta = _mapping(document.get("metadata"), f"{where}.metadata")
    job = _name(meta.get("name"), f"{where}.metadata.name", _DNS_LABEL, 63)
    namespace = str(meta.get("namespace") or "default")
    spec = _mapping(document.get("spec"), f"{where}.spec")
    shown = f"Job {namespace}/{job}"
    notes = [f"{shown}: spec.{key}" for key in _known(spec, _JOB_PLAYED, _JOB_NOT_PLAYED, f"{where}.spec")]
    tasks = spec.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise ScenarioError(f"{where}.spec.tasks: No task specified in job spec")
    queue = str(spec.get("queue") or DEFAULT_QUEUE)
    scheduler = str(spec.get("schedulerName") or DEFAULT_SCHEDULER)
    group = f"{job}-{uuidlib.uuid5(_JOB_UIDS, f'{namespace}/{job}')}"
    pods: list[Obj] = []
    task_of: dict[str, str] = {}
    task_min: dict[str, int] = {}
    for number, entry in enumerate(tasks):
        at = f"{where}.spec.tasks[{number}]"
        task = _mapping(entry, at)
        notes += [
            f"{shown}: spec.tasks[{number}].{key}" for key in _known(task, _TASK_PLAYED, _TASK_NOT_PLAYED, at)
        ]
        name = _name(task.get("name") or f"default{number}", f"{at}.name", _DNS_LABEL, 63)
        if name in task_min:
            raise ScenarioError(f"{at}.name: duplicated task name {name}")
        replicas = _count(task.get("replicas"), f"{at}.replicas", 0)
        task_min[name] = _count(task.get("minAvailable"), f"{at}.minAvailable", replicas)
        if task_min[name] > replicas:
            raise ScenarioError(
                f"{at}.minAvailable: 'minAvailable' is greater than 'replicas' in task: {name}, job: {job}"
            )
        template = _mapping(task.get("template"), f"{at}.template")
        for index in range(replicas):
            made = _from_template(template, f"{job}-{name}-{index}", namespace, f"{at}.template")
            _name(made["metadata"]["name"], f"{at}: pod name", _DNS_SUBDOMAIN, 63)
            made["spec"].setdefault("schedulerName", scheduler)
            made["metadata"]["annotations"] |= {
                TASK_INDEX: str(index),
                TASK_SPEC: name,
                keys.KUBE_GROUP_NAME: group,
                JOB_NAME: job,
                QUEUE_NAME: queue,
                JOB_VERSION: "0",
                TEMPLATE_UID: f"{job}-{name}",
                JOB_RETRY_COUNT: "0",
            }
            made["metadata"]["labels"] |= {
                TASK_INDEX: str(index),
                JOB_NAME: job,
                TASK_SPEC: name,
                JOB_NAMESPACE: namespace,
                QUEUE_NAME: queue,
            }
            task_of[made["metadata"]["name"]] = name
            pods.append(made)
    given = _count(spec.get("minAvailable"), f"{where}.spec.minAvailable", 0)
    min_available = given or sum(task_min.values())  # the webhook's default for 0 or none
    if min_available > len(pods):
        raise ScenarioError(
            f"{where}.spec.minAvailable: job 'minAvailable' should not be greater than total replicas "
            f"in tasks ({min_available} > {len(pods)})"
        )
    names = tuple(p["metadata"]["name"] for p in pods)
    gang = Gang(namespace, group, min_available, names, shown, task_of, task_min, queue)
    return Expanded(pods=pods, gangs=[gang], not_simulated=notes)


def pod_group(document: Obj, where: str) -> tuple[Gang, list[str]]:
    """A PodGroup on its own: its members are the scenario's pods that name it (filled in later)."""
    meta = _mapping(document.get("metadata"), f"{where}.metadata")
    name = _name(meta.get("name"), f"{where}.metadata.name")
    namespace = str(meta.get("namespace") or "default")
    spec = _mapping(document.get("spec"), f"{where}.spec")
    shown = f"PodGroup {namespace}/{name}"
    notes = [
        f"{shown}: spec.{key}" for key in _known(spec, ("minMember",), _GROUP_NOT_PLAYED, f"{where}.spec")
    ]
    minimum = _count(spec.get("minMember"), f"{where}.spec.minMember", 1)
    queue = str(spec.get("queue") or DEFAULT_QUEUE)
    return Gang(namespace, name, minimum, (), shown, queue=queue), notes
