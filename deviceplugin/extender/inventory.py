"""Cluster state as fit inputs: every node's GPUs (`GpuState`s) with the usage of the pods on them.

Fed by the node and pod caches' listeners, one event at a time, so a scheduling request reads
ready-made GPU states instead of rebuilding them:

- a node event rebuilds that node's GPUs only when what the plugin publishes about them changed
  (capacity, allocatable, the registration / health / memory-factor / topology annotations, the
  strategy label), then books its pods again; heartbeats that change nothing else cost a comparison;
- a pod event books or unbooks that one pod (`fit.add_*_pod` / `fit.remove_*_pod`).

Beside the GPU strategy's cards, a node keeps the cards of every configured Ascend chip it
carries (`NodeView.npus`, one `NpuCards` per `fit.families.ascend_families` entry: its count
resource in allocatable and its `hami.io/node-register-<commonWord>` registration); a pod is
booked on both. A node without Ascend keeps one shared empty tuple and pays nothing else.

Every `NodeView` has its own lock; a fit, a bind's fit-and-assume and every cache update of that
node happen under it. A bind *assumes* its pod at once (books it with the annotations it is about
to write), so the next fit on that node counts it even before the watch shows the bound pod;
events that still show the pod unbound are stale and leave the assumption alone.

A node or pod that cannot be read, whatever the fit library raises on it, costs only itself: the
node has no usable GPUs (its filter reason says why), the pod books nothing, and either is
reported once to its cache's `Rejections` (a log line and a count on `/metrics`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.fit import Compat, GpuState, VgpuConfig, holds_gpus, labelled_strategy, published_strategy
from deviceplugin.fit import keys as fitkeys
from deviceplugin.fit.ascend import NODE_HAMI_CORE
from deviceplugin.fit.codec import parse_memory_factor
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.families import AscendFamily, DeviceFamily, Family, family_of
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, MigGeometry, is_volcano_compat
from deviceplugin.fit.policy import Policy
from deviceplugin.fit.topology import TOPOLOGY_KEY, Topology, node_topology
from deviceplugin.kube.api import Obj
from deviceplugin.kube.rejections import Rejections, describe

_CAPACITY_KEYS = (fitkeys.GPU_MEMORY, fitkeys.GPU_NUMBER, fitkeys.NVIDIA_GPU)
# nvidia.com/gpu: kubelet lowers allocatable for unhealthy GPUs (the whole family reads it)
_ALLOCATABLE_KEYS = (fitkeys.VGPU_NUMBER, fitkeys.VGPU_MEMORY, fitkeys.VGPU_CORES, fitkeys.NVIDIA_GPU)
_ANNOTATION_KEYS = (
    fitkeys.NODE_VGPU_REGISTER,
    fitkeys.GPU_UNHEALTHY_IDS,
    fitkeys.GPU_MEMORY_FACTOR,
    TOPOLOGY_KEY,
)


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _section(obj: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    for key in path:
        value = obj.get(key) if isinstance(obj, Mapping) else None
        obj = value if isinstance(value, Mapping) else {}
    return obj


def pod_uid(pod: Obj) -> str:
    return str(_meta(pod).get("uid") or "")


def pod_node(pod: Obj) -> str:
    return str(_section(pod, "spec").get("nodeName") or "")


def node_name(node: Obj) -> str:
    return str(_meta(node).get("name") or "")


def _signature(node: Obj) -> tuple[object, ...]:
    """What the GPU view of a node is built from; anything else on the node is ignored."""
    capacity = _section(node, "status", "capacity")
    allocatable = _section(node, "status", "allocatable")
    notes = _section(node, "metadata", "annotations")
    return (  # one flat tuple: the extender keeps one per node
        *(capacity.get(key) for key in _CAPACITY_KEYS),
        *(allocatable.get(key) for key in _ALLOCATABLE_KEYS),
        *(notes.get(key) for key in _ANNOTATION_KEYS),
        _section(node, "metadata", "labels").get(fitkeys.GPU_STRATEGY_LABEL),
    )


def _npu_signature(node: Obj, families: Sequence[AscendFamily]) -> tuple[object, ...]:
    """What the Ascend cards of a node are built from; empty when it carries none of it (the
    signature of a GPU-only node is then the GPU one alone)."""
    if not families:
        return ()
    allocatable = _section(node, "status", "allocatable")
    notes = _section(node, "metadata", "annotations")
    values = (
        *(allocatable.get(family.chip.resource_name) for family in families),
        *(notes.get(family.chip.register_key) for family in families),
        notes.get(NODE_HAMI_CORE),
    )
    return values if any(value is not None for value in values) else ()


def other_strategy(node: Obj, family: Family) -> str:
    """Why a node running another GPU strategy cannot serve `family`'s resources, or "": its
    label `volcano.sh/gpu-strategy`, else what it publishes (fit.strategy). A node with no GPU
    resource at all is left to the fit, which says it has no GPUs."""
    name = node_name(node)
    try:
        labelled = labelled_strategy(node)
    except FitInputError as err:
        return f"node {name}: {err}"
    runs = labelled or published_strategy(node)
    if runs is None or family_of(runs) is family:
        return ""
    source = (
        f"label {fitkeys.GPU_STRATEGY_LABEL}" if labelled else "from what it publishes: no strategy label"
    )
    return (
        f"node {name} runs the {runs} GPU strategy ({source}), "
        f"which does not serve {', '.join(family.resources)}"
    )


def memory_factor(node: Obj) -> int:
    """MiB per memory unit the node's plugin advertises (`volcano.sh/gpu-memory-factor`, default 1)."""
    raw = _section(node, "metadata", "annotations").get(fitkeys.GPU_MEMORY_FACTOR)
    return 1 if raw is None else parse_memory_factor(raw)


@dataclass(eq=False, slots=True)
class NpuCards:
    """One Ascend chip's cards on a node (`AscendFamily.node_gpus`), or why they cannot be read."""

    cards: list[GpuState]
    error: str = ""


_NO_NPUS: tuple[NpuCards | None, ...] = ()


@dataclass(eq=False, slots=True)
class NodeView:
    """One node as the extender sees it. Read and change it only while holding `lock`. (Slots and
    shared defaults: the extender holds one per node of the cluster.)"""

    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    known: bool = False  # the node object has been seen (and not deleted)
    signature: tuple[object, ...] | None = None
    gpus: list[GpuState] = field(default_factory=list)
    config: VgpuConfig = DEFAULT_VGPU_CONFIG
    error: str = ""  # why the node's GPUs could not be read ("" when they could)
    topology: Topology | None = None  # how its GPUs connect; None: unpublished, unreadable or compat=volcano
    other_strategy: str = ""  # why the node runs a strategy other than the extender's ("" when not)
    # Per Ascend family of the inventory (same order): its cards here, None when the node has
    # none of that chip; the shared empty tuple when it has none at all.
    npus: tuple[NpuCards | None, ...] = _NO_NPUS
    pods: dict[str, Obj] = field(default_factory=dict)  # booked pods by UID
    # Booked by a bind, not yet seen bound by the watch (a dict as a set; None until the node's
    # first bind: most nodes have none at any time, and an empty dict is 64 bytes)
    assumed: dict[str, None] | None = None
    # Changes on every change, from the inventory's one counter: no two views, even of one node
    # name deleted and seen again, share a generation, so a result kept for one never passes for
    # another's.
    generation: int = 0
    quick: QuickFits | None = None  # the extender's quick fits on this node (ExtenderService)
    aware: AwareKept | None = None  # the gpu-aware score's findings here (extender.aware)
    retired: bool = False  # dropped from the inventory (see `Inventory`): look the node up again


QUICK_SHAPES = 8  # pod shapes whose host scores a node keeps (for its current generation)


@dataclass(eq=False, slots=True)
class AwareKept:
    """What the gpu-aware score found on one node for one generation of it (extender.aware)."""

    generation: int
    before: float  # the node's usable capacity (fit.fragment.usable)
    scores: dict[int, int] = field(default_factory=dict)  # host score by quick pod shape


@dataclass(eq=False, slots=True)
class QuickFits:
    """A node's GPUs as the family's quick fit reads them (`Family.quick_cards`: None where only
    the full fit decides), for one generation of the node and one schedule policy, and the host
    score found on them per pod request (None: the quick fit says no). Never changed once
    published on a view except by adding to `scores`: readers take it without the node's lock."""

    generation: int
    policy: Policy
    cards: Sequence[GpuState] | None
    scores: dict[int, int | None] = field(default_factory=dict)  # by the request's shape number


class Inventory:
    """Per-node GPU views kept current from node and pod events (`on_node`, `on_pod`); what
    cannot be read goes to `nodes` and `pods` (the caches' `rejections`). `ascend`: the Ascend
    chips' families served beside the strategy (`fit.families.ascend_families`). `mig_geometries`:
    the groups a `mig` card is sliced into (`knownMigGeometries`; without one for its model a
    `mig` card takes no pod, or is HAMi-core under compat="volcano").

    The view of a node that is gone (deleted, or never seen) is dropped once no pod is booked on
    it: node names come and go (autoscaling), and the inventory is not to grow with every name a
    cluster ever had. Whoever locks a view it looked up earlier checks `retired` (a view dropped
    meanwhile holds nothing), or takes it through `_locked_view`."""

    def __init__(
        self,
        strategy: Strategy,
        compat: Compat = None,
        *,
        nodes: Rejections | None = None,
        pods: Rejections | None = None,
        ascend: Sequence[AscendFamily] = (),
        mig_geometries: Sequence[MigGeometry] = (),
    ) -> None:
        self.family = family_of(strategy)  # chosen once: every node is fitted by the extender's strategy
        self.ascend = tuple(ascend)
        self.compat = compat
        self.mig_geometries = tuple(mig_geometries)
        self._configs: dict[int, VgpuConfig] = {}  # by memory factor, shared by the nodes advertising it
        self.rejected_nodes = nodes or Rejections("node")
        self.rejected_pods = pods or Rejections("pod")
        self._views: dict[str, NodeView] = {}
        self._pod_nodes: dict[str, str] = {}  # UID -> node it is booked on
        self._lock = threading.Lock()  # guards the two dicts above (not the views' contents)
        self._generations = itertools.count(1)  # every view's generations (`NodeView.generation`)

    # --- readers ------------------------------------------------------------------------------

    def view(self, name: str) -> NodeView | None:
        return self._views.get(name)

    @property
    def views(self) -> Mapping[str, NodeView]:
        """Every view by node name, for readers looking up thousands per request (read-only)."""
        return self._views

    def node_names(self) -> list[str]:
        with self._lock:
            return [name for name, view in self._views.items() if view.known]

    def node_of(self, uid: str) -> str:
        """The node a pod is booked on (bound, or assumed by a bind or a reserve); "" when none."""
        with self._lock:
            return self._pod_nodes.get(uid, "")

    def _view_for(self, name: str) -> NodeView:
        with self._lock:
            view = self._views.get(name)
            if view is None:
                view = self._views[name] = NodeView(name, generation=next(self._generations))
            return view

    @contextmanager
    def _locked_view(self, name: str) -> Iterator[NodeView]:
        """The node's view, made if missing, under its lock; one dropped before the lock was
        taken is looked up (made) again."""
        while True:
            view = self._view_for(name)
            with view.lock:
                if not view.retired:
                    yield view
                    return

    def _changed(self, view: NodeView) -> None:
        view.generation = next(self._generations)

    def _retire_if_idle(self, view: NodeView) -> None:
        """Drop the view of a node that is gone once nothing is booked on it (caller holds
        `view.lock`)."""
        if view.known or view.pods:  # an assumed pod is booked too
            return
        with self._lock:
            if self._views.get(view.name) is view:
                del self._views[view.name]
        view.retired = True

    # --- node events --------------------------------------------------------------------------

    def on_node(self, kind: str, node: Obj) -> None:
        name = node_name(node)
        if not name:
            return
        with self._locked_view(name) as view:
            if kind == "DELETED":
                view.known, view.signature, view.gpus, view.error = False, None, [], ""
                view.topology = None
                view.other_strategy, view.npus = "", _NO_NPUS
                self._changed(view)
                self._retire_if_idle(view)
                return
            view.known = True
            signature = _signature(node) + _npu_signature(node, self.ascend)
            if signature == view.signature:
                return
            view.signature = signature
            self._rebuild(view, node)

    def _rebuild(self, view: NodeView, node: Obj) -> None:
        # Volcano places pods by capacity alone (and so a gpu-number pod on a share-mode node).
        volcano = is_volcano_compat(self.compat)
        view.other_strategy = "" if volcano else other_strategy(node, self.family)
        try:
            config = self._config(memory_factor(node))
            gpus = self.family.node_gpus(node, config, self.compat)
            error = ""
        except Exception as err:  # malformed, or a bug reading it: this node alone has no GPUs
            config, gpus, error = DEFAULT_VGPU_CONFIG, [], f"node {view.name}: {describe(err)}"
            self.rejected_nodes.reject(node, err)
        view.config, view.gpus, view.error = config, gpus, error
        view.topology = None if volcano else self._topology(node)
        view.npus = self._npu_cards(view.name, node) if self.ascend else _NO_NPUS
        for pod in view.pods.values():
            self._add(view, pod)
        self._changed(view)

    def _topology(self, node: Obj) -> Topology | None:
        """The node's published topology; a malformed one is reported (`rejected_nodes`) and the
        node is fitted as one without: its GPUs are no less usable for it."""
        try:
            return node_topology(node)
        except Exception as err:
            self.rejected_nodes.reject(node, err)
            return None

    def _config(self, factor: int) -> VgpuConfig:
        config = self._configs.get(factor)
        if config is None:
            config = self._configs[factor] = VgpuConfig(
                memory_factor=factor, mig_geometries=self.mig_geometries
            )
        return config

    def _npu_cards(self, name: str, node: Obj) -> tuple[NpuCards | None, ...]:
        entries: list[NpuCards | None] = []
        for family in self.ascend:
            try:
                cards = family.node_gpus(node, DEFAULT_VGPU_CONFIG, self.compat)
                entries.append(NpuCards(cards) if cards else None)
            except Exception as err:  # this chip alone is unusable on the node
                entries.append(NpuCards([], f"node {name}: {family.chip.register_key}: {describe(err)}"))
                self.rejected_nodes.reject(node, err)
        return tuple(entries) if any(entry is not None for entry in entries) else _NO_NPUS

    # --- pod events ---------------------------------------------------------------------------

    def on_pod(self, kind: str, pod: Obj) -> None:
        uid = pod_uid(pod)
        if not uid:
            return
        target = pod_node(pod)
        try:
            holds = kind != "DELETED" and bool(target) and holds_gpus(pod, self.compat)
        except Exception as err:
            self.rejected_pods.reject(pod, err)
            holds = False
        with self._lock:
            previous = self._pod_nodes.get(uid)
        if previous is not None and (previous != target or not holds):
            with self._locked_view(previous) as old:
                if old.assumed and uid in old.assumed and kind != "DELETED" and not target:
                    return  # an event from before our bind: the assumption stands
                self._unbook(old, uid)
                self._retire_if_idle(old)
            with self._lock:
                if self._pod_nodes.get(uid) == previous:
                    del self._pod_nodes[uid]
        if holds:
            with self._locked_view(target) as view:
                if view.assumed:
                    view.assumed.pop(uid, None)
                self._book(view, uid, pod)
            with self._lock:
                self._pod_nodes[uid] = target

    # --- binds --------------------------------------------------------------------------------

    def assume(self, view: NodeView, pod: Obj) -> None:
        """Book a pod a bind is about to place on `view` (caller holds `view.lock`)."""
        uid = pod_uid(pod)
        if view.assumed is None:
            view.assumed = {}
        view.assumed[uid] = None
        self._book(view, uid, pod)
        with self._lock:
            self._pod_nodes[uid] = view.name

    def forget(self, view: NodeView, uid: str) -> None:
        """Undo `assume` after a failed bind (caller holds `view.lock`); a pod the watch has since
        shown bound stays booked."""
        if not view.assumed or uid not in view.assumed:
            return
        del view.assumed[uid]
        self._unbook(view, uid)
        self._retire_if_idle(view)
        with self._lock:
            if self._pod_nodes.get(uid) == view.name:
                del self._pod_nodes[uid]

    # --- booking (caller holds view.lock) -----------------------------------------------------

    def _book(self, view: NodeView, uid: str, pod: Obj) -> None:
        view.pods[uid] = pod
        self._add(view, pod)
        self._changed(view)

    def _unbook(self, view: NodeView, uid: str) -> None:
        if view.pods.pop(uid, None) is not None:
            self.family.unbook(view.gpus, uid, self.compat, view.config)
            for family, entry in zip(self.ascend, view.npus, strict=False):
                if entry is not None:
                    family.unbook(entry.cards, uid, self.compat, view.config)
            self._changed(view)

    def _add(self, view: NodeView, pod: Obj) -> None:
        self._add_to(self.family, view.gpus, view, pod)
        for family, entry in zip(self.ascend, view.npus, strict=False):
            if entry is not None:
                self._add_to(family, entry.cards, view, pod)

    def _add_to(self, family: DeviceFamily, gpus: list[GpuState], view: NodeView, pod: Obj) -> None:
        try:
            family.book(gpus, pod, self.compat, view.config)
        except Exception as err:
            # The pod's annotations cannot say which device it holds: nothing is booked for it, not
            # even what a reader that failed half-way had booked.
            family.unbook(gpus, pod_uid(pod), self.compat, view.config)
            self.rejected_pods.reject(pod, err)
