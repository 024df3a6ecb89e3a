"""The scheduler-side interface of a device family: one implementation per GPU strategy.

A scheduler (the extender, the simulated scheduler) picks a node's family once, by strategy
(`deviceplugin.fit.families.family_of`), and calls only these methods: nothing outside the
registry compares strategy names. Each method wraps the fit library's functions for its
strategy; a new mode or device family is one more implementation and one registry entry
(docs/families.md). The node daemon's side (what a node publishes, how Allocate reads a pod) is
`deviceplugin.plugin.family`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from deviceplugin.fit import objects
from deviceplugin.fit.fragment import Sharing
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import Compat, ContainerRequest, FitResult, GpuState, VgpuConfig
from deviceplugin.fit.policy import Policy
from deviceplugin.fit.topology import Topology


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What a pod asks of a family's resources, read once per scheduling request."""

    wants: bool  # False: the pod asks for none of the family's resources (it fits anywhere)
    containers: tuple[ContainerRequest, ...] = ()  # per-container requests, for families that read them
    units: int = 0  # the one amount a family asks (share: memory units, number: GPUs), else 0
    quick: bool = False  # the family's `quick` decides this pod's fit exactly as `fit` does


class DeviceFamily(Protocol):
    """One family's scheduling rules. Methods taking `gpus` change or read them only under the
    caller's lock for that node. A node runs one GPU strategy (`Family`) and, beside it, any
    number of families picked by what the node registers rather than by its strategy label (the
    Ascend chips, `fit.families.ascend`); a pod may ask several of them."""

    @property
    def resources(self) -> tuple[str, ...]:
        """The pod resources its device plugin serves."""

    @property
    def scores_per_device(self) -> bool:
        """True when `fit`'s score sums one score per device (the node score averages it)."""

    def request(self, pod: objects.Obj, compat: Compat) -> PodRequest:
        """The pod's request; raises FitInputError when it cannot be served as written."""

    def node_gpus(self, node: objects.Obj, config: VgpuConfig, compat: Compat) -> list[GpuState]:
        """The node's GPUs, empty of pods, from what its plugin publishes on the Node object."""

    def fit(
        self,
        gpus: Sequence[GpuState],
        pod: objects.Obj,
        request: PodRequest,
        *,
        policy: str | None,
        compat: Compat,
        config: VgpuConfig,
    ) -> FitResult:
        """Choose the pod's devices on one node, with a score by `policy`."""

    def quick_cards(
        self, gpus: Sequence[GpuState], policy: Policy, compat: Compat
    ) -> Sequence[GpuState] | None:
        """The node's GPUs as `quick` reads them (in the order the fit visits them), or None where
        only `fit` decides on this node. They depend on the node alone: build them once per change."""

    def quick(
        self, cards: Sequence[GpuState], request: PodRequest, policy: Policy
    ) -> tuple[float, int] | None:
        """For a request with `request.quick`, on `quick_cards`: `fit`'s score and number of devices
        when the pod fits, None when it does not (`fit` then says why). No result object and no
        message is built: a scheduler screening thousands of nodes per pod pays a few comparisons."""

    def bind_annotations(self, result: FitResult, node: str, now_ns: int, compat: Compat) -> dict[str, str]:
        """The annotations a bind writes for a fit's choice (`now_ns`: the decision's Unix time)."""

    def book(self, gpus: Sequence[GpuState], pod: objects.Obj, compat: Compat, config: VgpuConfig) -> None:
        """Count a placed pod's devices on `gpus` (from its annotations)."""

    def unbook(self, gpus: Sequence[GpuState], uid: str, compat: Compat, config: VgpuConfig) -> None:
        """Take the pod with `uid` off `gpus` again."""


class Family(DeviceFamily, Protocol):
    """One GPU strategy's scheduling rules, picked by the node's strategy label."""

    @property
    def strategy(self) -> Strategy:
        """The strategy this family implements (the node label's value)."""

    @property
    def sharing(self) -> Sharing:
        """How a card in use takes another pod (the gpu-aware score's usable capacity)."""

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
        """`DeviceFamily.fit`; `topology`: how the node's GPUs connect (its `volcano.sh/gpu-topology`
        annotation, `fit.topology.node_topology`), by which a multi-GPU request takes the
        best-linked of the cards its policy rates alike (docs/topology.md). It never changes
        whether the pod fits, its score or its device count, so `quick` reads none."""
