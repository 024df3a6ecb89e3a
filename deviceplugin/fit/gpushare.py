"""gpushare fit (`volcano.sh/gpu-memory`, `volcano.sh/gpu-number`): pod requests, card choice.

A pod's whole memory request goes on one card, the lowest-indexed healthy card with enough idle
memory; a gpu-number request takes whole idle cards (by default the best-linked of them on a node
that publishes its topology, docs/topology.md). Volcano scores neither (score 0); the
default scores by policy so an extender can binpack or spread nodes (docs/fit.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from deviceplugin.fit import goint, keys, objects
from deviceplugin.fit.errors import QuantityError, RequestError
from deviceplugin.fit.model import Assigned, Compat, FitResult, GpuState, is_volcano_compat
from deviceplugin.fit.policy import Policy, policy_of
from deviceplugin.fit.quantity import go_quantity_value, whole_quantity
from deviceplugin.fit.topology import Topology, best_set

Strategy = Literal["share", "number"]


def _container_units(pod: objects.Obj, container: objects.Obj, resource: str, volcano: bool) -> int:
    raw = objects.limits(container).get(resource)
    if raw is None:
        return 0
    if volcano:
        return go_quantity_value(raw)
    where = f"pod {objects.display_name(pod)} container {objects.container_name(container)!r}: {resource}"
    try:
        units = whole_quantity(raw)
    except QuantityError as err:
        raise RequestError(f"{where}: {err}") from None
    if units is None:
        raise RequestError(f"{where} must be a non-negative whole number, not {raw!r}")
    return units


def _pod_units(pod: objects.Obj, resource: str, compat: Compat) -> int:
    """max(sum over app containers, largest init container): init containers run one at a time,
    before the app containers. Only limits are read (extended resources are not overcommitted).

    Volcano sums memory in Go's `uint` (a negative quantity wraps to a huge request that fits
    nowhere) and GPU counts in `int`."""
    volcano = is_volcano_compat(compat)
    wrap = (goint.uint64 if resource == keys.GPU_MEMORY else goint.int64) if volcano else int
    app = wrap(sum(wrap(_container_units(pod, c, resource, volcano)) for c in objects.containers(pod)))
    inits = objects.init_containers(pod)
    init = max((wrap(_container_units(pod, c, resource, volcano)) for c in inits), default=0)
    return max(app, init)


def pod_gpu_memory(pod: objects.Obj, compat: Compat = None) -> int:
    """The pod's `volcano.sh/gpu-memory` request, in memory units."""
    return _pod_units(pod, keys.GPU_MEMORY, compat)


def pod_gpu_number(pod: objects.Obj, compat: Compat = None) -> int:
    """The pod's `volcano.sh/gpu-number` request, in whole GPUs."""
    return _pod_units(pod, keys.GPU_NUMBER, compat)


def pod_nvidia_gpus(pod: objects.Obj) -> int:
    """The pod's `nvidia.com/gpu` request, in whole GPUs, read strictly in both modes (Volcano has
    no whole-GPU mode to reproduce: docs/whole.md)."""
    return _pod_units(pod, keys.NVIDIA_GPU, None)


def _why_not(card: GpuState, need: int) -> str:
    if not card.health:
        return "unhealthy"
    return f"{card.free_memory} of {card.memory} MiB free, needs {need}"


def fit_gpushare(
    cards: Sequence[GpuState],
    pod: objects.Obj,
    *,
    strategy: Strategy = "share",
    policy: str | None = None,
    compat: Compat = None,
    rng: random.Random | None = None,
) -> FitResult:
    """Choose the card(s) for a gpushare pod on one node: `fit_share` or `fit_number`."""
    fit = _FITS.get(strategy)
    if fit is None:
        raise RequestError(f"gpushare strategy must be 'share' or 'number', not {strategy!r}")
    return fit(cards, pod, policy, compat, rng)


def fit_share(
    cards: Sequence[GpuState],
    pod: objects.Obj,
    *,
    policy: str | None = None,
    compat: Compat = None,
    need: int | None = None,
) -> FitResult:
    """The pod's memory on the lowest-indexed healthy card with enough idle memory. A pod without
    a `gpu-memory` request fits with no devices. `need`: the pod's `pod_gpu_memory`, when the
    caller fitting it on many nodes has read it once."""
    volcano = is_volcano_compat(compat)
    chosen = policy_of(policy, volcano)
    ordered = sorted(cards, key=lambda c: c.index)
    if need is None:
        need = pod_gpu_memory(pod, compat)
    if need <= 0:
        return FitResult(ok=True)
    card = next((c for c in ordered if c.health and _free_memory(c, volcano) >= need), None)
    if card is None:
        details = "; ".join(f"GPU {c.index}: {_why_not(c, need)}" for c in ordered)
        return FitResult(
            ok=False,
            reason=f"pod {objects.display_name(pod)} needs {need} MiB of GPU memory on one GPU; "
            f"none has it [{details}]",
        )
    assigned = Assigned(card.uuid, card.index, card.type, need, 0)
    return FitResult(ok=True, devices=((assigned,),), score=_share_score(card, need, chosen, volcano))


def quick_share(cards: Sequence[GpuState], need: int, policy: Policy) -> float | None:
    """`fit_share`'s score (compat None) for a request of `need` > 0 on `cards` in index order,
    None when it does not fit: the same choice without its result or messages, for a scheduler
    screening many nodes per pod."""
    for card in cards:
        if card.health and card.free_memory >= need:
            return _share_score(card, need, policy, False)
    return None


def fit_number(
    cards: Sequence[GpuState],
    pod: objects.Obj,
    *,
    policy: str | None = None,
    compat: Compat = None,
    rng: random.Random | None = None,
    need: int | None = None,
    topology: Topology | None = None,
) -> FitResult:
    """That many idle healthy cards: lowest index first, or by default on a node with a
    `topology` the best-linked set of them (every idle card scores alike, so the links choose). Volcano
    takes idle cards in Go map order, which is unspecified (B1); compat="volcano" draws them at
    random (`rng`) to match and reads no topology. A pod without a `gpu-number` request fits
    with no devices. `need`: the pod's `pod_gpu_number`, when the caller has read it once.

    compat="volcano", a pod that also asks `gpu-memory`: Volcano's filter counts idle cards, but
    its Allocate takes the memory branch first (`gpushare/device_info.go:Allocate`): one card, the
    lowest-indexed healthy one with enough free memory, shared or not; with none, the pod is not
    placed although the filter passed.
    """
    volcano = is_volcano_compat(compat)
    chosen = policy_of(policy, volcano)
    ordered = sorted(cards, key=lambda c: c.index)
    healthy = [c for c in ordered if c.health]
    if need is None:
        need = pod_gpu_number(pod, compat)
    if need <= 0:
        return FitResult(ok=True)
    idle = [c for c in healthy if not c.pods]
    if len(idle) < need:
        return FitResult(
            ok=False,
            reason=f"pod {objects.display_name(pod)} needs {need} idle GPU(s); the node has "
            f"{len(idle)} idle of {len(ordered)} ({len(ordered) - len(healthy)} unhealthy)",
        )
    memory = pod_gpu_memory(pod, compat) if volcano else 0
    if memory > 0:
        return _volcano_memory_branch(healthy, pod, memory, len(healthy) - len(idle))
    taken = (rng or random.Random()).sample(idle, need) if volcano else _linked_idle(idle, need, topology)
    devices = tuple(Assigned(c.uuid, c.index, c.type, c.memory, 0) for c in taken)
    return FitResult(
        ok=True, devices=(devices,), score=_number_score(len(healthy), len(idle) - need, chosen, volcano)
    )


def _linked_idle(idle: Sequence[GpuState], need: int, topology: Topology | None) -> Sequence[GpuState]:
    """`need` of the `idle` cards (index order): the best-linked set, the first ones without a topology."""
    if topology is None or need < 2:
        return idle[:need]
    by_index = {card.index: card for card in idle}
    if len(by_index) < len(idle):  # a repeated index: no set to tell apart
        return idle[:need]
    return [by_index[index] for index in best_set(topology, list(by_index), need)]


def quick_number(cards: Sequence[GpuState], need: int, policy: Policy) -> float | None:
    """`fit_number`'s score (compat None) for `need` > 0 whole GPUs, None when they are not there."""
    healthy = idle = 0
    for card in cards:
        if card.health:
            healthy += 1
            if not card.pods:
                idle += 1
    if idle < need:
        return None
    return _number_score(healthy, idle - need, policy, False)


_Fit = Callable[[Sequence[GpuState], objects.Obj, str | None, Compat, random.Random | None], FitResult]
_FITS: Mapping[str, _Fit] = {
    "share": lambda cards, pod, policy, compat, rng: fit_share(cards, pod, policy=policy, compat=compat),
    "number": lambda cards, pod, policy, compat, rng: fit_number(
        cards, pod, policy=policy, compat=compat, rng=rng
    ),
}


def _free_memory(card: GpuState, volcano: bool) -> int:
    """Idle memory; Volcano's used memory is a uint sum, clamped at the card's size."""
    if not volcano:
        return card.free_memory
    used = goint.uint64(card.used_memory)
    return 0 if used >= card.memory else card.memory - used


def _volcano_memory_branch(
    healthy: Sequence[GpuState], pod: objects.Obj, memory: int, busy: int
) -> FitResult:
    card = next((c for c in healthy if _free_memory(c, True) >= memory), None)
    if card is None:
        return FitResult(
            ok=False,
            reason=f"pod {objects.display_name(pod)} also asks {memory} MiB of {keys.GPU_MEMORY}: Volcano's "
            f"Allocate places it by memory, and no healthy GPU has that much free ({busy} in use)",
        )
    assigned = Assigned(card.uuid, card.index, card.type, memory, 0)
    return FitResult(ok=True, devices=((assigned,),))


def _share_score(card: GpuState, need: int, policy: Policy, volcano: bool) -> float:
    if volcano or policy.prefer is None or card.memory <= 0:
        return 0.0
    used = min(card.memory, card.used_memory + need) / card.memory
    return 100.0 * policy.prefer(used, 1.0 - used)


def _number_score(healthy: int, idle_after: int, policy: Policy, volcano: bool) -> float:
    if volcano or policy.prefer is None or healthy == 0:
        return 0.0
    idle = idle_after / healthy
    return 100.0 * policy.prefer(1.0 - idle, idle)
