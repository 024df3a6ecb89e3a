"""Filter, prioritize and bind: the extender's decisions, made by the shared-fit library.

Nothing here re-states a fit rule or names a strategy: each decision is the inventory's device
family (`deviceplugin.fit.family`) fitting the node's GPU states, under that node's lock. Filter
keeps the results of its full fits (per pod, per node, with the node's generation) and the quick
fits keep theirs on the node, so the prioritize call that follows reuses them instead of fitting
every node again; a node that changed in between is fitted afresh.

With thousands of nodes per request, each node is first given to the family's quick fit
(`Family.quick`: the same decision and score without building a result or a message, on the
node's cards as `Family.quick_cards` orders them, rebuilt once per node change); the host score it
finds is kept per pod shape until the node changes (`QuickFits`), so pods of one shape cost each
unchanged node one lookup. Only the nodes the quick fit cannot decide, and those where the pod
does not fit (the scheduler is told why), get the full fit.

With the gpu-aware score on (docs/gpu-aware.md), prioritize blends into each node's score what
the placement costs the node's usable capacity: that needs the cards the full fit chooses, so
every node is fitted in full (its score kept per pod shape until the node changes); off, the
paths above are untouched.

Bind fits the pod again on its node, against the current usage plus the pods other binds have
assumed, and assumes it before the API call, all under the node's lock: two binds to one node
never both get the same memory. A failed API call takes the assumption back.

A pod asking an Ascend chip (`Inventory.ascend`) is fitted family by family on each node, the
GPU strategy first and then the chips in configured order (Volcano's `RegisteredDevices`), and
fails on the first family that does not fit; its host score sums the families' scores before
Volcano's rounding and weight (`host_score_of`), and its bind writes every family's annotations.
Pods asking no Ascend chip take the paths above unchanged.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deviceplugin.extender.aware import AwareScores
from deviceplugin.extender.config import ExtenderConfig
from deviceplugin.extender.inventory import QUICK_SHAPES, Inventory, NodeView, QuickFits, pod_node, pod_uid
from deviceplugin.extender.protocol import (
    MAX_EXTENDER_PRIORITY,
    BindingArgs,
    ExtenderArgs,
    binding_result,
    filter_result,
    host_priorities,
)
from deviceplugin.extender.supernodes import SuperNodes
from deviceplugin.fit import FitInputError, FitResult, node_score, objects, pod_strategy
from deviceplugin.fit.families import AscendFamily, ascend_families
from deviceplugin.fit.family import DeviceFamily, PodRequest
from deviceplugin.fit.model import is_volcano_compat
from deviceplugin.fit.policy import Policy, policy_of
from deviceplugin.kube.api import ApiError, Obj
from deviceplugin.logs import get_log

log = get_log(__name__)

REMEMBERED_PODS = 1024  # pods seen in filter requests, for a bind the pod cache has not caught up with
CACHED_FITS = 16  # pods whose filter results are kept for prioritize
REMEMBERED_SHAPES = 1024  # pod shapes numbered for those scores
_NOT_KEPT = -1  # no host score is negative

NpuRequests = tuple[tuple[int, PodRequest], ...]
"""The Ascend families a pod asks: (index in `Inventory.ascend`, the request), in configured order."""
Fits = list[tuple[DeviceFamily, FitResult]]
POD_WAIT_S = 1.0  # how long a bind waits for the pod cache to show a pod it does not know


class PodFinder(Protocol):
    def find(self, namespace: str, name: str, uid: str, timeout_s: float) -> Obj | None:
        """The pod from the cluster pod cache, waiting up to `timeout_s` for it to appear."""


Binder = Callable[[str, str, str, Mapping[str, str], str], object]
"""Creates the Binding: (namespace, name, node, annotations, uid)."""


def _display(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('uid') or '?'}"


def _pod_key(pod: Obj) -> str:
    return pod_uid(pod) or _display(pod)


class ExtenderService:
    def __init__(
        self,
        config: ExtenderConfig,
        inventory: Inventory,
        *,
        pods: PodFinder | None = None,
        binder: Binder | None = None,
        readiness: Callable[[], list[str]] = list,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self._pods = pods
        self._binder = binder
        self.readiness = readiness  # why it cannot decide now (empty when it can): for /readyz
        self._lock = threading.Lock()
        # Per pod, per node: (the node's generation, the host score) filter found.
        self._fits: OrderedDict[str, dict[str, tuple[int, int]]] = OrderedDict()
        self._seen: OrderedDict[str, Obj] = OrderedDict()
        self._shapes: dict[PodRequest, int] = {}
        self._shape_numbers = itertools.count()
        self._npu_names = frozenset(name for family in inventory.ascend for name in family.resources)
        # Super-node groups (docs/supernode.md): fed by the caches' listeners (app.Extender); not
        # Volcano's deviceshare, so compat volcano reads no group size.
        self.supernodes = SuperNodes(inventory, on=not is_volcano_compat(config.compat))
        # The chips configured but switched off (ascend-hami-vnpu false): their pods are refused.
        off = () if config.serves_ascend else ascend_families(config.vnpus)
        self._npu_off = frozenset(name for family in off for name in family.resources)
        # The gpu-aware blend (docs/gpu-aware.md), None when off: compat volcano keeps Volcano's scores.
        weights = config.gpu_aware
        self._aware = (
            AwareScores(weights, inventory.family.sharing)
            if weights.on and not is_volcano_compat(config.compat)
            else None
        )

    # --- pod requests and fits ----------------------------------------------------------------

    def request_of(self, pod: Obj) -> PodRequest:
        """Raises FitInputError when the pod's request cannot be served as written (by default also
        when it mixes two strategies' resources, which Volcano does not check)."""
        compat = self.config.compat
        if not is_volcano_compat(compat):
            pod_strategy(pod)
        return self.inventory.family.request(pod, compat)

    def npu_requests(self, pod: Obj) -> NpuRequests:
        """The pod's request of each Ascend family it asks; raises FitInputError as `request_of`."""
        if not _names_any(pod, self._npu_names):
            return ()  # most pods: what costs a GPU pod's cycle a few set lookups, not a parse per chip
        compat = self.config.compat
        asked = ((index, family.request(pod, compat)) for index, family in enumerate(self.inventory.ascend))
        return tuple((index, request) for index, request in asked if request.wants)

    def _fit_all(
        self, name: str, view: NodeView, pod: Obj, request: PodRequest, npus: NpuRequests
    ) -> tuple[str, bool, Fits]:
        """Fit every family the pod asks on one node; caller holds `view.lock`. (Why not, "" when
        it fits; whether no change of usage can help; each family's fit.) Volcano's predicate
        stops at the first family that fails, the GPU strategy's first."""
        fits: Fits = []
        if request.wants or not view.known:
            why = self._unusable(name, view)
            if why:
                return why, True, fits
        if request.wants:
            try:
                result = self._fit(view, pod, request)
            except FitInputError as err:
                result = FitResult(ok=False, reason=str(err))
            if not result.ok:
                return result.reason, False, fits
            fits.append((self.inventory.family, result))
        config = self.config
        for index, npu_request in npus:
            family = self.inventory.ascend[index]
            entry = view.npus[index] if view.npus else None
            if entry is None or not entry.cards:
                if is_volcano_compat(config.compat):
                    continue  # Volcano's predicate skips a device type the node does not have
                return (entry.error if entry else "") or _no_chip(name, family), True, fits
            try:
                result = family.fit(
                    entry.cards,
                    pod,
                    npu_request,
                    policy=config.policy,
                    compat=config.compat,
                    config=view.config,
                )
            except FitInputError as err:
                result = FitResult(ok=False, reason=str(err))
            if not result.ok:
                return f"{family.name}: {result.reason}", False, fits
            fits.append((family, result))
        return "", False, fits

    def _fit(self, view: NodeView, pod: Obj, request: PodRequest) -> FitResult:
        """Fit on one node, its GPU topology choosing among the cards the policy rates alike
        (docs/topology.md); caller holds `view.lock`."""
        config = self.config
        return self.inventory.family.fit(
            view.gpus,
            pod,
            request,
            policy=config.policy,
            compat=config.compat,
            config=view.config,
            topology=view.topology,
        )

    def _shape(self, request: PodRequest) -> int:
        """A number for the request's shape, the same for equal requests: the key of `QuickFits`
        scores (an int hashes at once; a request would hash its fields on every node). Numbers
        are never reused, so a shape forgotten here misses in every node's scores."""
        with self._lock:
            shape = self._shapes.get(request)
            if shape is None:
                if len(self._shapes) >= REMEMBERED_SHAPES:
                    self._shapes.clear()
                shape = self._shapes[request] = next(self._shape_numbers)
            return shape

    def _quick_score(self, view: NodeView, request: PodRequest, shape: int, policy: Policy) -> int | None:
        """The host score when the family's quick fit finds the pod fits on `view`; None when the
        full fit must decide (it does not fit, or quick cannot tell).

        Pods of one shape come in runs (a job's replicas) and most nodes do not change between
        two of them: the score found for a request is kept with the node's generation, so the
        next pod of that shape costs each unchanged node a lookup, taken without the node's lock
        (what it reads is never changed once published)."""
        quick, generation = view.quick, view.generation
        if quick is not None and quick.generation == generation and quick.policy is policy:
            kept = quick.scores.get(shape, _NOT_KEPT)
            if kept != _NOT_KEPT:
                return kept
        family = self.inventory.family
        with view.lock:
            generation, quick = view.generation, view.quick
            if quick is None or quick.generation != generation or quick.policy is not policy:
                unusable = self._unusable(view.name, view)
                cards = None if unusable else family.quick_cards(view.gpus, policy, self.config.compat)
                view.quick = quick = QuickFits(generation, policy, cards)
            fit = None if quick.cards is None else family.quick(quick.cards, request, policy)
            score = None if fit is None else self.devices_score(*fit)
            if len(quick.scores) >= QUICK_SHAPES:
                quick.scores.clear()
            quick.scores[shape] = score
        return score

    def _unusable(self, name: str, view: NodeView | None) -> str:
        """Why a node cannot take any pod of this strategy, or "" when it can be fitted."""
        if view is None or not view.known:
            return f"node {name} is not in the extender's node cache"
        if view.other_strategy:
            return view.other_strategy
        if view.error:
            return view.error
        if not view.gpus:
            return f"node {name} publishes no GPUs for strategy {self.inventory.family.strategy}"
        return ""

    def _remember(self, pod: Obj) -> None:
        key = pod_uid(pod)
        if not key:
            return
        with self._lock:
            self._seen[key] = pod
            self._seen.move_to_end(key)
            while len(self._seen) > REMEMBERED_PODS:
                self._seen.popitem(last=False)

    def _not_ready(self) -> str:
        problems = self.readiness()
        return f"the extender is not ready: {'; '.join(problems)}" if problems else ""

    # --- filter -------------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        pod = args.pod
        self._remember(pod)
        if problem := self._not_ready():
            return filter_result(args, [], {}, {}, error=problem)
        try:
            request = self.request_of(pod)
            npus = self.npu_requests(pod) if self.inventory.ascend else ()
        except FitInputError as err:
            return filter_result(args, [], {}, {}, error=str(err))
        if self._npu_off and _names_any(pod, self._npu_off):
            return filter_result(args, [], {}, dict.fromkeys(args.node_names, _ASCEND_OFF))
        if not request.wants and not npus:
            return filter_result(args, list(args.node_names), {}, {})
        if npus:
            return self._filter_npus(args, request, npus)
        try:
            groups = self.supernodes.verdict(pod)
        except FitInputError as err:
            return filter_result(args, [], {}, {}, error=str(err))
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        fits: dict[str, tuple[int, int]] = {}
        views = self.inventory.views
        policy = self._policy()
        shape = self._shape(request)
        for name in args.node_names:
            if groups is not None:
                why, hopeless = groups.refuses(name)
                if why:
                    (unresolvable if hopeless else failed)[name] = why
                    continue
            view = views.get(name)
            # Prioritize finds a quick fit's score in the node's QuickFits: none is kept here, so
            # a filter over 20,000 nodes leaves no 20,000 entries to the collector.
            if (
                view is not None
                and request.quick
                and self._quick_score(view, request, shape, policy) is not None
            ):
                passed.append(name)
                continue
            why = self._unusable(name, view)
            if why or view is None:
                unresolvable[name] = why
                continue
            with view.lock:
                try:
                    result = self._fit(view, pod, request)
                except FitInputError as err:
                    result = FitResult(ok=False, reason=str(err))
                fits[name] = (view.generation, self.host_score(result))
            if result.ok:
                passed.append(name)
            else:
                failed[name] = result.reason
        self._keep_fits(pod, fits)
        return filter_result(args, passed, failed, unresolvable)

    def _keep_fits(self, pod: Obj, fits: dict[str, tuple[int, int]]) -> None:
        with self._lock:
            key = _pod_key(pod)
            self._fits[key] = fits
            self._fits.move_to_end(key)
            while len(self._fits) > CACHED_FITS:
                self._fits.popitem(last=False)

    def _filter_npus(self, args: ExtenderArgs, request: PodRequest, npus: NpuRequests) -> dict[str, Any]:
        """Filter for a pod asking an Ascend chip (and perhaps the GPU strategy): every family fitted
        on every node (an Ascend node has a handful of cards: no quick fit)."""
        pod = args.pod
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        fits: dict[str, tuple[int, int]] = {}
        views = self.inventory.views
        for name in args.node_names:
            view = views.get(name)
            if view is None:
                unresolvable[name] = self._unusable(name, view)
                continue
            with view.lock:
                why, hopeless, results = self._fit_all(name, view, pod, request, npus)
                if not why:
                    fits[name] = (view.generation, self.host_score_of(results))
            if not why:
                passed.append(name)
            elif hopeless:
                unresolvable[name] = why
            else:
                failed[name] = why
        self._keep_fits(pod, fits)
        return filter_result(args, passed, failed, unresolvable)

    # --- prioritize ---------------------------------------------------------------------------

    def host_score(self, result: FitResult) -> int:
        """0..MaxExtenderPriority: the fit's score (0..100 per device: binpack rewards fuller GPUs,
        spread idle ones) averaged over the pod's devices, scaled to 0..10 and multiplied by the
        weight with Volcano's node-score rounding (0 when weight <= 0), capped at 10."""
        if not result.ok:
            return 0
        return self.devices_score(result.score, sum(len(container) for container in result.devices))

    def devices_score(self, score: float, devices: int) -> int:
        """`host_score` of a fit that scored `score` on `devices` devices."""
        return self._scaled(self._per_device(score, devices))

    def _per_device(self, score: float, devices: int) -> float:
        return score / devices if self.inventory.family.scores_per_device and devices else score

    def _aware_score(
        self, aware: AwareScores, view: NodeView, pod: Obj, request: PodRequest, shape: int
    ) -> int:
        """`host_score` with the gpu-aware score blended in (`extender.aware`)."""
        if self._unusable(view.name, view):
            return 0

        def fit() -> FitResult:
            try:
                return self._fit(view, pod, request)
            except FitInputError:
                return FitResult(ok=False)

        def base(result: FitResult) -> float:
            return self._per_device(result.score, sum(len(container) for container in result.devices))

        return aware.score(view, request, shape, fit=fit, base=base, scaled=self._scaled)

    def host_score_of(self, fits: Fits) -> int:
        """The host score of a pod fitted by several families: Volcano's node order sums the raw
        score of every device type the pod asks (`getDeviceScore`) before rounding it and
        applying the weight once; each family's part is what `host_score` takes of it alone."""
        total = 0.0
        for family, result in fits:
            devices = sum(len(container) for container in result.devices)
            total += result.score / devices if family.scores_per_device and devices else result.score
        return self._scaled(total)

    def _scaled(self, score: float) -> int:
        value = node_score(score / 10.0, self.config.weight)
        return int(min(max(value, 0.0), float(MAX_EXTENDER_PRIORITY)))

    def _policy(self) -> Policy:
        return policy_of(self.config.policy, is_volcano_compat(self.config.compat))

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        pod = args.pod
        if self._not_ready() or self.config.weight <= 0:
            return host_priorities([(name, 0) for name in args.node_names])
        try:
            request = self.request_of(pod)
            npus = self.npu_requests(pod) if self.inventory.ascend else ()
        except FitInputError:
            request, npus = PodRequest(False), ()
        if not request.wants and not npus:
            return host_priorities([(name, 0) for name in args.node_names])
        with self._lock:
            cached = self._fits.get(_pod_key(pod), {})
        if npus:
            return self._prioritize_npus(args, request, npus, cached)
        scores: list[tuple[str, int]] = []
        score_of = self.host_score
        views = self.inventory.views
        policy = self._policy()
        shape = self._shape(request)
        aware = self._aware
        for name in args.node_names:
            view = views.get(name)
            if aware is not None:
                score = 0 if view is None else self._aware_score(aware, view, pod, request, shape)
                scores.append((name, score))
                continue
            entry = cached.get(name)
            if view is not None and entry is not None and entry[0] == view.generation:
                scores.append((name, entry[1]))  # filter's fit, and the node is unchanged
                continue
            if view is not None and request.quick:
                quick = self._quick_score(view, request, shape, policy)
                if quick is not None:
                    scores.append((name, quick))
                    continue
            if self._unusable(name, view) or view is None:
                scores.append((name, 0))
                continue
            with view.lock:
                try:
                    result = self._fit(view, pod, request)
                except FitInputError:
                    result = FitResult(ok=False)
            scores.append((name, score_of(result)))
        return host_priorities(self._group_preference(pod, scores))

    def _group_preference(self, pod: Obj, scores: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """`scores` with a best-effort super-node group's preference first (docs/supernode.md)."""
        try:
            groups = self.supernodes.verdict(pod)
        except FitInputError:  # filter refused the pod and said why
            return scores
        return scores if groups is None else groups.ranked(scores, MAX_EXTENDER_PRIORITY)

    def _prioritize_npus(
        self, args: ExtenderArgs, request: PodRequest, npus: NpuRequests, cached: dict[str, tuple[int, int]]
    ) -> list[dict[str, Any]]:
        scores: list[tuple[str, int]] = []
        views = self.inventory.views
        for name in args.node_names:
            view = views.get(name)
            entry = cached.get(name)
            if view is not None and entry is not None and entry[0] == view.generation:
                scores.append((name, entry[1]))
                continue
            score = 0
            if view is not None:
                with view.lock:
                    why, _, results = self._fit_all(name, view, args.pod, request, npus)
                score = 0 if why else self.host_score_of(results)
            scores.append((name, score))
        return host_priorities(scores)

    # --- bind ---------------------------------------------------------------------------------

    def _find_pod(self, args: BindingArgs) -> Obj | None:
        pod = None
        if self._pods is not None:
            pod = self._pods.find(args.pod_namespace, args.pod_name, args.pod_uid, POD_WAIT_S)
        if pod is None and args.pod_uid:
            with self._lock:
                pod = self._seen.get(args.pod_uid)
        return pod

    def _unknown(self, args: BindingArgs) -> str:
        """Why a bind's pod was not found: replaced by a pod of the same name, or unknown."""
        if args.pod_uid and self._pods is not None:
            now = self._pods.find(args.pod_namespace, args.pod_name, "", 0)
            if now is not None:
                return f"pod {args.pod_display} has uid {pod_uid(now)}, not {args.pod_uid}: it was replaced"
        return f"pod {args.pod_display} (uid {args.pod_uid or '?'}) is not known to the extender"

    def bind(self, args: BindingArgs) -> dict[str, str]:
        began = time.monotonic()
        error = self._bind(args)
        if error:
            log.warning("bind refused", pod=args.pod_display, node=args.node, error=error)
        else:
            took_ms = round((time.monotonic() - began) * 1000, 1)
            log.info("bound", pod=args.pod_display, node=args.node, took_ms=took_ms)
        return binding_result(error)

    def _bind(self, args: BindingArgs) -> str:
        if self._binder is None:
            return "this extender has no Kubernetes API to bind with"
        if problem := self._not_ready():
            return problem
        pod = self._find_pod(args)
        if pod is None:
            return self._unknown(args)
        if bound := pod_node(pod):
            return f"pod {args.pod_display} is already bound to node {bound}"
        error, annotations = self._assume(pod, args.node)
        if error:
            return f"cannot bind pod {args.pod_display} to node {args.node}: {error}"
        try:
            self._binder(args.pod_namespace, args.pod_name, args.node, annotations, pod_uid(pod))
        except Exception as err:  # an API error, or an answer that cannot be read (a proxy's page)
            if annotations:  # else the booking outlives the failed bind while the pod stays pending
                self.unreserve(pod, args.node)
            why = err if isinstance(err, ApiError) else f"unreadable answer: {type(err).__name__}: {err}"
            return f"binding pod {args.pod_display} to node {args.node} failed: {why}"
        return ""

    def _assume(self, pod: Obj, node: str) -> tuple[str, dict[str, str]]:
        """Fit `pod` on `node` and book it there with the annotations a bind writes, under the
        node's lock: (why not, "" when booked; the annotations, empty when the pod asks for none
        of this strategy's resources and nothing was booked)."""
        try:
            request = self.request_of(pod)
            npus = self.npu_requests(pod) if self.inventory.ascend else ()
        except FitInputError as err:
            return str(err), {}
        if npus:
            return self._assume_npus(pod, node, request, npus)
        if not request.wants:
            return "", {}
        view = self.inventory.view(node)
        if view is None:
            return self._unusable(node, view), {}
        with view.lock:  # read under it: a node deleted meanwhile is unknown (its view retired)
            if why := self._unusable(node, view):
                return why, {}
            try:
                result = self._fit(view, pod, request)
            except FitInputError as err:
                result = FitResult(ok=False, reason=str(err))
            if not result.ok:
                return result.reason, {}
            annotations = self.inventory.family.bind_annotations(
                result, node, time.time_ns(), self.config.compat
            )
            self.inventory.assume(view, _bound(pod, node, annotations))
        return "", annotations

    def _assume_npus(
        self, pod: Obj, node: str, request: PodRequest, npus: NpuRequests
    ) -> tuple[str, dict[str, str]]:
        """`_assume` for a pod asking an Ascend chip: every family's annotations, merged as
        Volcano's predicates plugin merges each device type's `Allocate` into the pod."""
        view = self.inventory.view(node)
        if view is None:
            return self._unusable(node, view), {}
        with view.lock:
            why, _, results = self._fit_all(node, view, pod, request, npus)
            if why:
                return why, {}
            now_ns = time.time_ns()
            annotations: dict[str, str] = {}
            for family, result in results:
                annotations.update(family.bind_annotations(result, node, now_ns, self.config.compat))
            if annotations:
                self.inventory.assume(view, _bound(pod, node, annotations))
        return "", annotations

    # --- reserve (in-process callers only: the HTTP protocol has no such verb) ---------------

    def reserve(self, pod: Obj, node: str) -> str:
        """Book `pod` on `node` as a bind would, without binding: later fits count it (the
        scheduling framework's Reserve; how the simulated scheduler tries a gang whole before it
        binds any member). Why not, or "" when booked or when the pod asks for nothing here."""
        if problem := self._not_ready():
            return problem
        return self._assume(pod, node)[0]

    def unreserve(self, pod: Obj, node: str) -> None:
        """Undo `reserve` (or a bind's booking that the API refused)."""
        view = self.inventory.view(node)
        if view is not None:
            with view.lock:
                self.inventory.forget(view, pod_uid(pod))


def _names_any(pod: Obj, names: frozenset[str]) -> bool:
    """Whether a container or init container of the pod limits or requests one of `names`."""
    for container in (*objects.init_containers(pod), *objects.containers(pod)):
        if not names.isdisjoint(objects.limits(container)) or not names.isdisjoint(
            objects.requests(container)
        ):
            return True
    return False


_ASCEND_OFF = (
    "Ascend vNPUs are not served: the extender runs with ascend-hami-vnpu "
    "(deviceshare.AscendHAMiVNPUEnable) false"
)


def _no_chip(name: str, family: AscendFamily) -> str:
    chip = family.chip
    return (
        f"node {name} has no {chip.common_word} cards (it needs allocatable {chip.resource_name} above 0 "
        f"and the {chip.register_key} registration of the HAMi Ascend device plugin)"
    )


def _bound(pod: Obj, node: str, annotations: Mapping[str, str]) -> Obj:
    """The pod as the Binding will leave it: on `node`, carrying `annotations`."""
    metadata = dict(pod.get("metadata") or {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    return {**pod, "metadata": metadata, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
