"""The simulated cluster's scheduler: kube-scheduler driving the extenders over HTTP, with Volcano's
gang rule.

One pod: kube-scheduler's own filters (`kubefilters`), then every extender interested in the pod's
resources (as `managedResources` makes kube-scheduler call them) filters and scores the remaining
nodes; the best node wins (ties: fewer pods, then name) and the pod is bound through the first
interested extender's `/bind`, or with a plain Binding when no extender is interested. A pod with
`spec.nodeName` is not scheduled at all.

A gang (a Volcano Job's pod group, or a PodGroup) is all or nothing, as Volcano's gang plugin: each
member is decided in turn and reserved on its node (the extender books it without binding, so the
next member's fit counts it); unless `minMember` members (and, when `minMember` covers every task's
minimum, each task's minimum) found a node, the reservations are dropped and none is bound.

Events as kube-scheduler posts them: `Scheduled` for a bound pod, `FailedScheduling` (with the
filters' and extenders' reasons, and the pod's PodScheduled condition set False) for one that stays
Pending.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any

from deviceplugin.extender import Extender
from deviceplugin.fit import objects
from deviceplugin.kube.events import Involved, event_body
from deviceplugin.plugin.devices import RESOURCES
from kubesim import kubefilters
from kubesim.apiserver import ApiServerEmulator
from kubesim.apiserver.errors import ApiError
from kubesim.apiserver.meta import rfc3339
from kubesim.failures import SimulationError
from kubesim.workloads import Gang, Obj

HTTP_TIMEOUT_S = 10.0
CACHE_WAIT_S = 10.0  # how long a gang waits for the extenders' caches to show its members
DEFAULT_SCHEDULER = "default-scheduler"


@dataclass
class Decision:
    """Where one pod goes, or why it stays Pending."""

    pod: Obj
    node: str = ""
    #: Node -> why it was filtered out.
    failed: dict[str, str] = field(default_factory=dict)
    problem: str = ""
    #: The pod came with `spec.nodeName`: nobody schedules it.
    prebound: bool = False

    @property
    def key(self) -> str:
        return objects.namespaced_name(self.pod)


def _post(url: str, body: object) -> Any:
    """An extender's answer; an extender that does not answer is the simulation's failure."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())
    except (OSError, ValueError) as err:
        raise SimulationError(f"extender {url}: {err}") from None


def _asked(pod: Obj) -> set[str]:
    return {
        name
        for container in [*objects.init_containers(pod), *objects.containers(pod)]
        for name in [*objects.limits(container), *objects.requests(container)]
    }


def _managed(extender: Extender) -> set[str]:
    """The resources the extender is configured for (`managedResources`): the Ascend chips' for an
    extender serving them, else its GPU strategy's."""
    if extender.inventory.ascend:
        return {name for family in extender.inventory.ascend for name in family.resources}
    return {resource.name for resource in RESOURCES[extender.config.strategy]}


def _shown(asked: Mapping[str, Fraction]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(asked.items())) or "no extended resource"


class SimScheduler:
    def __init__(self, apiserver: ApiServerEmulator, extenders: Mapping[str, Extender]) -> None:
        self.apiserver = apiserver
        self.extenders = extenders

    # --- one pod ----------------------------------------------------------------------------------

    def schedule(self, pod: Obj) -> Decision:
        decision = self._decide(pod, {})
        if decision.node and not decision.prebound:
            self._bind(decision)
        if decision.problem:
            self._unschedulable(decision, self._summary(decision))
        return decision

    def _interested(self, pod: Obj) -> list[Extender]:
        asked = _asked(pod)
        return [
            self.extenders[key] for key in sorted(self.extenders) if asked & _managed(self.extenders[key])
        ]

    def _ignored(self) -> set[str]:
        """The managed resources kube-scheduler is told to ignore (`ignoredByScheduler: true`):
        the Ascend chips' -memory and -core, which no node advertises."""
        return {
            name for e in self.extenders.values() for f in e.inventory.ascend for name in f.ignored_resources
        }

    def _decide(self, pod: Obj, reserved: Mapping[str, Sequence[Obj]]) -> Decision:
        """Filter and score, binding nothing; `reserved` are pods a gang trial has placed so far."""
        decision = Decision(pod)
        nodes = {objects.metadata(n)["name"]: n for n in self.apiserver.list("nodes")}
        preset = str((pod.get("spec") or {}).get("nodeName") or "")
        if preset:
            decision.prebound = True
            if preset in nodes:
                decision.node = preset
            else:
                decision.problem = f"spec.nodeName names node {preset}, which the cluster does not have"
            return decision
        pods_on = self._pods_by_node(reserved)
        ignored = self._ignored()
        asked = {name: value for name, value in kubefilters.pod_requests(pod).items() if name not in ignored}
        candidates = []
        for name, node in sorted(nodes.items()):
            if not kubefilters.affinity_fits(pod, node):
                decision.failed[name] = kubefilters.AFFINITY_MISMATCH
            elif short := kubefilters.insufficient(asked, node, pods_on.get(name, [])):
                decision.failed[name] = ", ".join(short)
            else:
                candidates.append(name)
        scores = dict.fromkeys(candidates, 0)
        for extender in self._interested(pod):
            if not candidates:
                break
            strategy = extender.config.strategy
            answer = _post(extender.url + "/filter", {"Pod": pod, "NodeNames": candidates})
            if answer.get("Error"):
                decision.problem = f"unschedulable: the {strategy} extender refuses it: {answer['Error']}"
                return decision
            for failures in ("FailedNodes", "FailedAndUnresolvableNodes"):
                decision.failed |= answer.get(failures) or {}
            candidates = list(answer.get("NodeNames") or [])
            if candidates:
                scored = _post(extender.url + "/prioritize", {"Pod": pod, "NodeNames": candidates})
                for entry in scored:
                    scores[entry["Host"]] = scores.get(entry["Host"], 0) + int(entry["Score"])
        if not candidates:
            missing = [r for r in asked if not kubefilters.served_anywhere(r, list(nodes.values()))]
            head = f"no node serves {', '.join(missing)}; " if missing else ""
            reasons = "; ".join(f"{name}: {why}" for name, why in sorted(decision.failed.items()))
            decision.problem = f"unschedulable: {head}{reasons or 'the cluster has no node'}"
            return decision
        decision.node = min(candidates, key=lambda n: (-scores.get(n, 0), len(pods_on.get(n, [])), n))
        return decision

    def _pods_by_node(self, reserved: Mapping[str, Sequence[Obj]]) -> dict[str, list[Obj]]:
        placed: dict[str, list[Obj]] = {node: list(pods) for node, pods in reserved.items()}
        for pod in self.apiserver.list("pods"):
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not objects.is_terminal(pod):
                placed.setdefault(node, []).append(pod)
        return placed

    def _bind(self, decision: Decision) -> None:
        pod, node = decision.pod, decision.node
        meta = objects.metadata(pod)
        namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
        interested = self._interested(pod)
        if interested:
            args = {"PodName": name, "PodNamespace": namespace, "PodUID": objects.uid(pod), "Node": node}
            error = _post(interested[0].url + "/bind", args).get("Error") or ""
        else:
            try:
                self.apiserver.bind(namespace, name, node)
                error = ""
            except ApiError as err:
                error = str(err)
        if error:
            decision.node, decision.problem = "", f"binding to {node} failed: {error}"
            return
        self._event(pod, "Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}")

    # --- gangs ------------------------------------------------------------------------------------

    def schedule_gang(self, pods: Sequence[Obj], gang: Gang) -> list[Decision]:
        """Try every member, reserving each on its node; bind them all, or none."""
        self._await_members(pods)
        reserved: dict[str, list[Obj]] = {}
        held: list[tuple[Decision, list[Extender]]] = []
        decisions = []
        for pod in pods:
            decision = self._decide(pod, reserved)
            if decision.node and not decision.prebound:
                booked = self._reserve(decision)
                if decision.node:
                    reserved.setdefault(decision.node, []).append(pod)
                    held.append((decision, booked))
            decisions.append(decision)
        for decision, booked in held:
            for extender in booked:
                extender.service.unreserve(decision.pod, decision.node)
        short = _gang_short(gang, decisions)
        for decision in decisions:
            if short:
                if not decision.prebound:
                    decision.node = ""
                decision.problem = short
                self._unschedulable(decision, short)
                continue
            if decision.node and not decision.prebound:
                self._bind(decision)
            if decision.problem:
                self._unschedulable(decision, self._summary(decision))
        return decisions

    def _await_members(self, pods: Sequence[Obj]) -> None:
        """Until every interested extender's caches hold the gang's members: an extender counts a
        job's size from its pod cache (super-node groups), as Volcano's gang plugin waits for
        the job's pods before it places any."""
        for extender in {id(e): e for pod in pods for e in self._interested(pod)}.values():
            seen = extender.service.supernodes.has_seen
            extender.pods.wait_until(partial(_all_seen, seen, pods), CACHE_WAIT_S)

    def _reserve(self, decision: Decision) -> list[Extender]:
        booked: list[Extender] = []
        for extender in self._interested(decision.pod):
            why = extender.service.reserve(decision.pod, decision.node)
            if why:
                for done in booked:
                    done.service.unreserve(decision.pod, decision.node)
                decision.failed[decision.node] = why
                decision.problem = f"unschedulable: {decision.node}: {why}"
                decision.node = ""
                return []
            booked.append(extender)
        return booked

    # --- telling the user -------------------------------------------------------------------------

    def _summary(self, decision: Decision) -> str:
        """The FailedScheduling message kube-scheduler would write."""
        if not decision.failed:
            return decision.problem
        return kubefilters.summary(decision.failed, len(self.apiserver.list("nodes")))

    def _unschedulable(self, decision: Decision, message: str) -> None:
        pod = decision.pod
        meta = objects.metadata(pod)
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": rfc3339(time.time()),
        }
        if not decision.prebound:
            self.apiserver.patch(
                "pods",
                str(meta["name"]),
                {"status": {"conditions": [condition]}},
                str(meta.get("namespace")),
                subresource="status",
            )
        self._event(pod, "Warning", "FailedScheduling", message)

    def _event(self, pod: Obj, kind: str, reason: str, message: str) -> None:
        scheduler = str((pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER)
        event = event_body(Involved.pod(pod), kind, reason, message, "")
        event |= {
            "source": {"component": scheduler},
            "reportingComponent": scheduler,
            "reportingInstance": "",
        }
        self.apiserver.create("events", event)


def _all_seen(seen: Callable[[Obj], bool], pods: Sequence[Obj], _cache: object) -> bool:
    return all(map(seen, pods))


def _gang_short(gang: Gang, decisions: Sequence[Decision]) -> str:
    """Why the gang cannot start, or "" when it can."""
    placed = [d for d in decisions if d.node]
    where = f"pod group {gang.namespace}/{gang.name} ({gang.source}, minMember {gang.min_member})"
    if len(placed) < gang.min_member:
        first = next((d for d in decisions if not d.node), None)
        why = ""
        if first is not None:
            asked = _shown(kubefilters.pod_requests(first.pod))
            why = f"; {first.key} ({asked}) found no node: {first.problem}"
        return (
            f"gang not scheduled: {where}: {len(placed)} of {len(decisions)} pods can be placed, "
            f"so none is bound{why}"
        )
    if gang.min_member >= sum(gang.task_min.values()):
        for task, minimum in gang.task_min.items():
            count = sum(1 for d in placed if gang.task_of.get(objects.metadata(d.pod)["name"]) == task)
            if count < minimum:
                return (
                    f"gang not scheduled: {where}: task {task} has {count} of its minAvailable {minimum} "
                    "pods placed, so none is bound"
                )
    return ""
