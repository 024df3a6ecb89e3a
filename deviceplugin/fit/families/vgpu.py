"""The `vgpu` family (HAMi's vGPU resources): GPUs read from the node's registration annotation,
per-container requests, pods placed by `devices-to-allocate` (fit.vgpu, fit.usage)."""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.fit import objects
from deviceplugin.fit.bind import vgpu_bind_annotations
from deviceplugin.fit.family import PodRequest
from deviceplugin.fit.fragment import Sharing
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import Compat, FitResult, GpuState, VgpuConfig
from deviceplugin.fit.policy import Policy
from deviceplugin.fit.strategy import STRATEGY_RESOURCES
from deviceplugin.fit.topology import Topology
from deviceplugin.fit.usage import add_vgpu_pod, remove_vgpu_pod, vgpu_gpus
from deviceplugin.fit.vgpu import fit_vgpu, parse_vgpu_requests, plain_request, quick_vgpu, visiting_order

NS_PER_S = 1_000_000_000


class VgpuFamily:
    """Slices of cards (count, memory, cores) per container."""

    strategy: Strategy = "vgpu"
    sharing: Sharing = "slots"
    scores_per_device = True  # fit_vgpu sums a score per card it chose

    @property
    def resources(self) -> tuple[str, ...]:
        return STRATEGY_RESOURCES[self.strategy]

    def request(self, pod: objects.Obj, compat: Compat) -> PodRequest:
        requests = tuple(parse_vgpu_requests(pod, compat=compat))
        return PodRequest(bool(requests), requests, quick=plain_request(pod, requests, compat))

    def node_gpus(self, node: objects.Obj, config: VgpuConfig, compat: Compat) -> list[GpuState]:
        return vgpu_gpus(node, config=config, compat=compat)

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
        return fit_vgpu(gpus, request.containers, pod, policy, compat, config=config, topology=topology)

    def quick_cards(
        self, gpus: Sequence[GpuState], policy: Policy, compat: Compat
    ) -> Sequence[GpuState] | None:
        return visiting_order(gpus, policy, compat)

    def quick(
        self, cards: Sequence[GpuState], request: PodRequest, policy: Policy
    ) -> tuple[float, int] | None:
        container = request.containers[0]
        score = quick_vgpu(cards, container, policy)
        return None if score is None else (score, container.nums)

    def bind_annotations(self, result: FitResult, node: str, now_ns: int, compat: Compat) -> dict[str, str]:
        return vgpu_bind_annotations(result, node, now_ns // NS_PER_S, compat)

    def book(self, gpus: Sequence[GpuState], pod: objects.Obj, compat: Compat, config: VgpuConfig) -> None:
        add_vgpu_pod(gpus, pod, compat, config=config)

    def unbook(self, gpus: Sequence[GpuState], uid: str, compat: Compat, config: VgpuConfig) -> None:
        remove_vgpu_pod(gpus, uid, compat, config=config)
