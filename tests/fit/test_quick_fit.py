"""The quick fit (`Family.quick` on `Family.quick_cards`) against the full fit, over many generated
nodes and pods: wherever a request says `quick`, both must agree on whether the pod fits and, when
it does, on the score and the number of devices. The full fit is the library's entry point as the
conformance tests call it (the pod read afresh, not the request the family parsed once)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from deviceplugin.fit import GpuState, fit_gpushare, fit_vgpu, parse_vgpu_requests
from deviceplugin.fit import keys as k
from deviceplugin.fit.families import family_of
from deviceplugin.fit.model import FitResult, MigGroup, MigInstance, MigState, PodUsage
from deviceplugin.fit.policy import policy_of
from tests.fit.builders import CORES, MEM, NUM, PCT, container, pod

CASES = 3000  # node-pod pairs per strategy and policy
POLICIES = ("", "binpack", "spread")
MEMORIES = (0, 1024, 16384, 40960, 81559)
TYPES = ("NVIDIA-H100", "NVIDIA-A100", "Tesla-T4")


def _usage(rng: random.Random, n: int) -> dict[str, PodUsage]:
    return {f"u{i}": PodUsage(f"u{i}", f"ns/p{i}", memory=rng.choice((0, 1024, 8192))) for i in range(n)}


def _card(rng: random.Random, index: int, mig: bool) -> GpuState:
    memory = rng.choice(MEMORIES)
    split = rng.choice((1, 2, 4, 10))
    cores = rng.choice((100, 100, 50))
    used_num = rng.choice((0, 0, 0, 1, 2, split, split + 1))
    card = GpuState(
        index=index,
        uuid=f"GPU-{index}",
        type=rng.choice(TYPES),
        memory=memory,
        split_count=split,
        cores=cores,
        health=rng.random() > 0.1,
        mode=rng.choice((k.MODE_HAMI_CORE, k.MODE_MPS)),
        used_num=used_num,
        used_memory=rng.choice((0, 0, memory // 4, memory // 2, memory, memory + 10)),
        used_cores=rng.choice((0, 0, 20, cores, cores + 5)),
        pods=_usage(rng, min(used_num, 3)),
    )
    if mig:
        card.mode = k.MODE_MIG
        card.mig = MigState((MigGroup("g", (MigInstance("1g.10gb", 10240, 7),)),))
    return card


def _node(rng: random.Random) -> list[GpuState]:
    count = rng.choice((1, 2, 4, 8, 8))
    indices = rng.sample(range(10), count) if rng.random() < 0.2 else list(range(count))
    mig = rng.random() < 0.05
    cards = [_card(rng, index, mig and n == 0) for n, index in enumerate(indices)]
    rng.shuffle(cards)  # the fits must order them, not the caller
    return cards


def _annotations(rng: random.Random) -> dict[str, str]:
    """Mostly none; else one that changes which cards a vGPU pod may use (no quick path then)."""
    choices: tuple[dict[str, str], ...] = (
        {},
        {},
        {},
        {},
        {},
        {},
        {k.VGPU_MODE: k.MODE_MPS},
        {k.VGPU_USE_UUID: "GPU-1"},
        {k.VGPU_NOUSE_UUID: "GPU-0,GPU-2"},
        {k.USE_GPUTYPE: "A100"},
        {k.NOUSE_GPUTYPE: "T4"},
        {k.VGPU_PODGROUP_POLICY: k.PODGROUP_POLICY_SPREAD, k.KUBE_GROUP_NAME: "g"},
        {"example.com/other": "x"},
    )
    return dict(rng.choice(choices))


def _vgpu_limits(rng: random.Random) -> dict[str, str]:
    limits = {NUM: str(rng.choice((1, 1, 1, 2, 3, 9)))}
    memory = rng.random()
    if memory < 0.4:
        limits[MEM] = str(rng.choice((1024, 8192, 20000, 81559, 90000)))
    elif memory < 0.7:
        limits[PCT] = str(rng.choice((1, 25, 50, 100)))
    if rng.random() < 0.6:
        limits[CORES] = str(rng.choice((0, 10, 50, 100)))
    return limits


def _limits(rng: random.Random, strategy: str) -> dict[str, str]:
    if strategy == "share":
        return {k.GPU_MEMORY: str(rng.choice((1, 1024, 8192, 40960, 81559, 90000)))}
    if strategy == "number":
        return {k.GPU_NUMBER: str(rng.choice((1, 2, 3, 8, 9)))}
    return _vgpu_limits(rng)


def _pod(rng: random.Random, strategy: str, n: int) -> dict[str, object]:
    containers = [container(f"c{i}", _limits(rng, strategy)) for i in range(rng.choice((1, 1, 1, 2)))]
    return pod(f"p{n}", containers, annotations=_annotations(rng))


def _full(strategy: str, gpus: list[GpuState], the_pod: dict[str, object], policy: str) -> FitResult:
    if strategy == "vgpu":
        return fit_vgpu(gpus, parse_vgpu_requests(the_pod), the_pod, policy)
    return fit_gpushare(gpus, the_pod, strategy="share" if strategy == "share" else "number", policy=policy)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
def test_the_quick_fit_decides_and_scores_as_the_full_fit(strategy: str, policy: str) -> None:
    family = family_of(strategy)
    chosen = policy_of(policy, False)
    rng = random.Random(f"{strategy}-{policy}")
    seen: Counter[str] = Counter()
    for n in range(CASES):
        gpus, the_pod = _node(rng), _pod(rng, strategy, n)
        request = family.request(the_pod, None)
        cards = family.quick_cards(gpus, chosen, None)
        full = _full(strategy, gpus, the_pod, policy)
        if not (request.wants and request.quick and cards is not None):
            seen["full fit only"] += 1
            continue
        quick = family.quick(cards, request, chosen)
        if full.ok:
            devices = sum(len(placed) for placed in full.devices)
            assert quick == (full.score, devices), (gpus, the_pod)
            seen["fits"] += 1
        else:
            assert quick is None, (gpus, the_pod, full.reason)
            seen["does not fit"] += 1
    # Each outcome was met often enough for a broken rule to show.
    assert min(seen["fits"], seen["does not fit"]) >= CASES // 20, seen
    if strategy == "vgpu":
        assert seen["full fit only"] >= CASES // 10, seen


@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
def test_volcano_compat_never_takes_the_quick_path(strategy: str) -> None:
    family = family_of(strategy)
    rng = random.Random(strategy)
    gpus, the_pod = _node(rng), _pod(rng, strategy, 0)
    assert not family.request(the_pod, "volcano").quick
    assert family.quick_cards(gpus, policy_of("binpack", True), "volcano") is None


def test_a_node_with_a_mig_card_is_left_to_the_full_fit() -> None:
    rng = random.Random(5)
    gpus = [_card(rng, 0, True), _card(rng, 1, False)]
    assert family_of("vgpu").quick_cards(gpus, policy_of("binpack", False), None) is None


@pytest.mark.parametrize(
    "annotations",
    [
        {k.VGPU_MODE: k.MODE_HAMI_CORE},
        {k.VGPU_USE_UUID: "GPU-1"},
        {k.VGPU_NOUSE_UUID: "GPU-1"},
        {k.USE_GPUTYPE: "A100"},
        {k.NOUSE_GPUTYPE: "T4"},
        {k.VGPU_PODGROUP_POLICY: k.PODGROUP_POLICY_SPREAD},
    ],
)
def test_a_vgpu_pod_whose_annotations_limit_its_cards_is_left_to_the_full_fit(
    annotations: dict[str, str],
) -> None:
    the_pod = pod("p", [container("c", {NUM: "1"})], annotations=annotations)
    assert not family_of("vgpu").request(the_pod, None).quick


def test_a_vgpu_pod_of_two_gpu_containers_is_left_to_the_full_fit() -> None:
    the_pod = pod("p", [container("a", {NUM: "1"}), container("b", {NUM: "1"})])
    assert not family_of("vgpu").request(the_pod, None).quick
    assert family_of("vgpu").request(pod("q", [container("a", {NUM: "1"})]), None).quick
