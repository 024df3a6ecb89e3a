"""The kube-scheduler filters the simulated scheduler runs before the extenders: node selector and
required node affinity (NodeAffinity), and extended resources against what the node can still
allocate (NodeResourcesFit). CPU and memory are not checked: the simulated nodes report the
machine the simulation runs on, not the cluster a scenario describes.

Reasons read as kube-scheduler words them, so `kubectl describe pod` shows the familiar text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from deviceplugin.fit import objects
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.quantity import parse_quantity

Obj = Mapping[str, Any]

AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"


def is_extended(resource: str) -> bool:
    """A resource kube-scheduler counts against allocatable as an extended one (`vendor/name`)."""
    return "/" in resource and not resource.startswith(("kubernetes.io/", "requests."))


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """What the pod asks of each extended resource: requests, else limits (the API server copies
    limits into requests), summed over app containers, at least the largest init container's."""
    totals: dict[str, Fraction] = {}
    for container in objects.containers(pod):
        for name, value in _asked(container).items():
            totals[name] = totals.get(name, Fraction(0)) + value
    for container in objects.init_containers(pod):
        for name, value in _asked(container).items():
            totals[name] = max(totals.get(name, Fraction(0)), value)
    return {name: value for name, value in totals.items() if value > 0}


def _asked(container: Obj) -> dict[str, Fraction]:
    given = {**objects.limits(container), **objects.requests(container)}
    asked = {}
    for name, value in given.items():
        if is_extended(name):
            try:
                asked[name] = parse_quantity(value)
            except FitInputError:
                continue  # the API server would have refused the pod; the extender says why
    return asked


def affinity_fits(pod: Obj, node: Obj) -> bool:
    """`spec.nodeSelector` and the required node affinity terms (any term; all its expressions)."""
    labels = objects.labels_of(node)
    spec = pod.get("spec") or {}
    if not (spec.get("nodeSelector") or {}).items() <= labels.items():
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    name = str(objects.metadata(node).get("name") or "")
    return not terms or any(_term_fits(term, labels, name) for term in terms)


def _term_fits(term: Obj, labels: Mapping[str, str], name: str) -> bool:
    expressions = [(e, labels) for e in term.get("matchExpressions") or []]
    expressions += [(e, {"metadata.name": name}) for e in term.get("matchFields") or []]
    return bool(expressions) and all(_matches(e, values) for e, values in expressions)


def _matches(expression: Obj, labels: Mapping[str, str]) -> bool:
    key, operator = str(expression.get("key") or ""), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def insufficient(asked: Mapping[str, Fraction], node: Obj, pods_there: Iterable[Obj]) -> list[str]:
    """The extended resources the node cannot give the pod, as `Insufficient <name>`."""
    allocatable = objects.status_resources(node, "allocatable")
    used: dict[str, Fraction] = {}
    for other in pods_there:
        for name, value in pod_requests(other).items():
            used[name] = used.get(name, Fraction(0)) + value
    short = []
    for name, value in sorted(asked.items()):
        try:
            free = parse_quantity(allocatable.get(name, "0")) - used.get(name, Fraction(0))
        except FitInputError:
            free = Fraction(0)
        if value > free:
            short.append(f"Insufficient {name}")
    return short


def served_anywhere(resource: str, nodes: Sequence[Obj]) -> bool:
    """Some node advertises the resource at all."""
    return any(resource in objects.status_resources(node, "allocatable") for node in nodes)


def summary(failed: Mapping[str, str], total: int) -> str:
    """kube-scheduler's FailedScheduling message: `0/3 nodes are available: 1 <why>, 2 <why>.`"""
    counts: dict[str, int] = {}
    for why in failed.values():
        counts[why] = counts.get(why, 0) + 1
    reasons = sorted(f"{count} {why}" for why, count in counts.items())
    return f"0/{total} nodes are available: {', '.join(reasons)}."
