"""The `share` (`volcano.sh/gpu-memory`) and `number` (`volcano.sh/gpu-number`) families: cards
read from the node's capacity, pods placed by `volcano.sh/gpu-index` (fit.gpushare, fit.usage)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.fit import keys, objects
from deviceplugin.fit.bind import gpushare_bind_annotations
from deviceplugin.fit.family import PodRequest
from deviceplugin.fit.fragment import Sharing
from deviceplugin.fit.gpushare import (
    fit_number,
    fit_share,
    pod_gpu_memory,
    pod_gpu_number,
    quick_number,
    quick_share,
)
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import Compat, FitResult, GpuState, VgpuConfig, is_volcano_compat
from deviceplugin.fit.policy import Policy
from deviceplugin.fit.strategy import STRATEGY_RESOURCES
from deviceplugin.fit.topology import Topology
from deviceplugin.fit.usage import add_gpushare_pod, gpushare_cards, remove_gpushare_pod


def _section(obj: object, key: str) -> Mapping[str, Any]:
    """`obj[key]` when both are mappings, else empty: a malformed section is the fit's to report."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


class ShareFamily:
    """A pod's memory on one card."""

    strategy: Strategy = "share"
    sharing: Sharing = "memory"
    scores_per_device = False

    @property
    def resources(self) -> tuple[str, ...]:
        return STRATEGY_RESOURCES[self.strategy]

    def request(self, pod: objects.Obj, compat: Compat) -> PodRequest:
        need = pod_gpu_memory(pod, compat)
        return PodRequest(need > 0, units=need, quick=not is_volcano_compat(compat))

    def node_gpus(self, node: objects.Obj, config: VgpuConfig, compat: Compat) -> list[GpuState]:
        return gpushare_cards(node, compat=compat)

    def fit(
        self,
        gpus: Sequence[GpuState],
        pod: objects.Obj,
        request: PodRequest,
        *,
        policy: str | None,
        compat: Compat,
        config: VgpuConfig,
        topology: Topology | None = None,
    ) -> FitResult:
        return fit_share(gpus, pod, policy=policy, compat=compat, need=request.units)  # one card: no links

    def quick_cards(
        self, gpus: Sequence[GpuState], policy: Policy, compat: Compat
    ) -> Sequence[GpuState] | None:
        return None if is_volcano_compat(compat) else tuple(sorted(gpus, key=lambda g: g.index))

    def quick(
        self, cards: Sequence[GpuState], request: PodRequest, policy: Policy
    ) -> tuple[float, int] | None:
        score = quick_share(cards, request.units, policy)
        return None if score is None else (score, 1)

    def bind_annotations(self, result: FitResult, node: str, now_ns: int, compat: Compat) -> dict[str, str]:
        return gpushare_bind_annotations(result, now_ns)

    def book(self, gpus: Sequence[GpuState], pod: objects.Obj, compat: Compat, config: VgpuConfig) -> None:
        add_gpushare_pod(gpus, pod, compat)

    def unbook(self, gpus: Sequence[GpuState], uid: str, compat: Compat, config: VgpuConfig) -> None:
        remove_gpushare_pod(gpus, uid)


class NumberFamily(ShareFamily):
    """Whole idle cards; booked and bound as `share` is."""

    strategy: Strategy = "number"
    sharing: Sharing = "whole"

    def request(self, pod: objects.Obj, compat: Compat) -> PodRequest:
        need = pod_gpu_number(pod, compat)
        return PodRequest(need > 0, units=need, quick=not is_volcano_compat(compat))

    def node_gpus(self, node: objects.Obj, config: VgpuConfig, compat: Compat) -> list[GpuState]:
        status = _section(node, "status")
        capacity = _section(status, "capacity")
        if keys.GPU_MEMORY not in capacity:
            # Number-mode nodes publish only the card count; whole cards need no memory figure.
            node = {**node, "status": {**status, "capacity": {**capacity, keys.GPU_MEMORY: "0"}}}
        return gpushare_cards(node, compat=compat)

    def fit(
        self,
        gpus: Sequence[GpuState],
        pod: objects.Obj,
        request: PodRequest,
        *,
        policy: str | None,
        compat: Compat,
        config: VgpuConfig,
        topology: Topology | None = None,
    ) -> FitResult:
        return fit_number(gpus, pod, policy=policy, compat=compat, need=request.units, topology=topology)

    def quick(
        self, cards: Sequence[GpuState], request: PodRequest, policy: Policy
    ) -> tuple[float, int] | None:
        score = quick_number(cards, request.units, policy)
        return None if score is None else (score, request.units)
