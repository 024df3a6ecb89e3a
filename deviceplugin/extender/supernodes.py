"""Super-node groups in the extender: what `fit.supernode.place` needs, kept from the caches' events.

- Every node's super-node (its `volcano.sh/super-node` label), from the node cache's events.
- Every pod group's GPU pods (uid -> GPUs asked by count), pending or placed, from the pod cache's
  events: the job's size is the pods of its pod group the cache holds (the extender caches pods,
  not PodGroups), so a job's pods must exist before its first one is filtered, as Volcano's job
  controller creates them and its gang plugin waits for them.
- Where each of them is placed: the inventory's booking (`Inventory.node_of`), which counts a pod
  from the moment a bind or a reserve assumes it.
- Every super-node's free whole GPUs: the idle healthy cards of its nodes as the inventory knows
  them, counted again for a node only when its view changed.

`verdict(pod)` answers for a pod with a group size (None for any other, at the cost of two
annotation lookups): the super-nodes its group rule allows, why each node outside them is refused,
and the best-effort preference that reorders the node scores.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deviceplugin.extender.inventory import Inventory, node_name, pod_uid
from deviceplugin.fit import objects
from deviceplugin.fit.errors import FitInputError, RequestError
from deviceplugin.fit.supernode import (
    SUPER_NODE_LABEL,
    Placement,
    check_sizes,
    idle_cards,
    place,
    pod_gpus,
    ranked,
    read_sizes,
)
from deviceplugin.kube.api import Obj


@dataclass(frozen=True, slots=True)
class Verdict:
    """The group rule's answer for one pod. `of` is the index's live node -> super-node map (read
    one key at a time, without its lock)."""

    placement: Placement
    of: Mapping[str, str]

    def refuses(self, node: str) -> tuple[str, bool]:
        """Why the pod may not go to `node` ("" when it may), and whether no change of usage can
        help (the node is in no super-node)."""
        supernode = self.of.get(node)
        if not supernode:
            return (
                f"node {node} has no {SUPER_NODE_LABEL} label: a job with a GPU group size is placed in "
                "super-nodes only",
                True,
            )
        if supernode in self.placement.allowed:
            return "", False
        return self.placement.refusals.get(supernode, f"super-node {supernode} is not allowed"), False

    def ranked(self, scores: Sequence[tuple[str, int]], top: int) -> list[tuple[str, int]]:
        """`scores` reordered by the best-effort preference (unchanged without one)."""
        preferred = self.placement.preferred
        if not preferred:
            return list(scores)
        levels = [preferred.get(self.of.get(name, ""), 0) for name, _ in scores]
        return ranked(scores, levels, top)


class SuperNodes:
    """The index; `on_node` and `on_pod` are the node and pod caches' listeners. Off (`on`
    False), `verdict` reads no group size."""

    def __init__(self, inventory: Inventory, *, on: bool = True) -> None:
        self._inventory = inventory
        self._on = on  # off: every pod is ungrouped (compat volcano)
        self._lock = threading.Lock()
        self._of: dict[str, str] = {}  # node -> super-node
        self._nodes: dict[str, set[str]] = {}  # super-node -> nodes
        self._jobs: dict[str, dict[str, int]] = {}  # pod group `namespace/name` -> uid -> GPUs
        self._job_of: dict[str, str] = {}  # uid -> pod group
        self._idle: dict[str, tuple[int, int]] = {}  # node -> (view generation, idle cards)

    # --- cache events -------------------------------------------------------------------------

    def on_node(self, kind: str, node: Obj) -> None:
        name = node_name(node)
        if not name:
            return
        labels = (node.get("metadata") or {}).get("labels")
        label = labels.get(SUPER_NODE_LABEL) if isinstance(labels, Mapping) else None
        supernode = label if kind != "DELETED" and isinstance(label, str) else ""
        with self._lock:
            if kind == "DELETED":
                self._idle.pop(name, None)
            before = self._of.get(name, "")
            if before == supernode:
                return
            if before:
                members = self._nodes[before]
                members.discard(name)
                if not members:
                    del self._nodes[before]
                del self._of[name]
            if supernode:
                self._of[name] = supernode
                self._nodes.setdefault(supernode, set()).add(name)

    def on_pod(self, kind: str, pod: Obj) -> None:
        uid = pod_uid(pod)
        if not uid:
            return
        job, gpus = _member(pod) if kind != "DELETED" else ("", 0)
        with self._lock:
            before = self._job_of.pop(uid, "")
            if before:
                members = self._jobs[before]
                members.pop(uid, None)
                if not members:
                    del self._jobs[before]
            if job:
                self._job_of[uid] = job
                self._jobs.setdefault(job, {})[uid] = gpus

    def has_seen(self, pod: Obj) -> bool:
        """Whether the index counts `pod` in its job, or it is no member (a GPU pod of a pod group
        that has not ended): how a caller knows the pod cache's events for it have arrived."""
        job, _ = _member(pod)
        with self._lock:
            return not job or self._job_of.get(pod_uid(pod)) == job

    # --- decisions ----------------------------------------------------------------------------

    def verdict(self, pod: Obj) -> Verdict | None:
        """The group rule for `pod`, None when it asks for no group; FitInputError (naming the
        annotation) when its group sizes cannot be served."""
        notes = objects.metadata(pod).get("annotations")  # read as given: only the size keys matter
        sizes = read_sizes(notes) if self._on and isinstance(notes, Mapping) else None
        if sizes is None:
            return None
        job = objects.podgroup_key(pod)
        if not job:
            raise RequestError(
                "a GPU group size needs the pod's pod group (annotation scheduling.k8s.io/group-name "
                "or scheduling.volcano.sh/group-name): its groups are counted over the job's pods"
            )
        uid, gpus = pod_uid(pod), pod_gpus(pod)
        with self._lock:
            members = {**self._jobs.get(job, {}), uid: gpus}
            nodes = {supernode: tuple(names) for supernode, names in self._nodes.items()}
        check_sizes(sizes, gpus, sum(members.values()), len(members))
        placed: dict[str, int] = {}
        for member, asked in members.items():
            where = self._inventory.node_of(member) if member != uid else ""
            supernode = self._of.get(where, "") if where else ""
            if supernode:
                placed[supernode] = placed.get(supernode, 0) + asked
        free = {supernode: sum(self._idle_on(name) for name in names) for supernode, names in nodes.items()}
        return Verdict(place(placed, free, sizes, gpus), self._of)

    def _idle_on(self, name: str) -> int:
        """The node's idle healthy cards (none on a node of another strategy or unreadable)."""
        view = self._inventory.view(name)
        if view is None or not view.known:
            return 0
        kept = self._idle.get(name)
        if kept is not None and kept[0] == view.generation:
            return kept[1]
        with view.lock:
            generation = view.generation
            idle = 0 if view.other_strategy or view.error else idle_cards(view.gpus)
        self._idle[name] = (generation, idle)
        return idle


def _member(pod: Obj) -> tuple[str, int]:
    """(pod group, GPUs) of a pod its job counts; ("", 0) for any other (no pod group, no GPU
    count, ended, or unreadable: the inventory reports a malformed pod)."""
    try:
        job = objects.podgroup_key(pod)
        gpus = pod_gpus(pod) if job and not objects.is_terminal(pod) else 0
    except FitInputError:
        return "", 0
    return (job, gpus) if gpus else ("", 0)
