"""A multi-GPU vGPU fit on a node with a topology asks every card's rules at once to find the
cards the links may choose from, and its walk then takes those cards without asking again. With a
topology that rates every card set alike, the links choose nothing, so the fit must equal the fit
without a topology in every respect (cards, score, message), under every per-card rule: a card
wrongly counted in or out of the links' candidates shows up as another card or another decision."""

from __future__ import annotations

import random

import pytest

from deviceplugin.fit import GpuState, fit_vgpu, parse_vgpu_requests
from deviceplugin.fit import keys as k
from deviceplugin.fit.model import PodUsage
from deviceplugin.fit.topology import Link, Topology
from tests.fit.builders import CORES, MEM, NUM, PCT, container, pod
from tests.fit.test_quick_fit import POLICIES

EXCLUSIVE_RULES = ({"app": "solo"}, {"team": "x", "tier": "gold"})
LABELS: tuple[dict[str, str], ...] = ({}, {"app": "solo"}, {"team": "x", "tier": "gold"}, {"team": "x"})


def _card(rng: random.Random, index: int) -> GpuState:
    memory = rng.choice((16000, 32000))
    used_num = rng.choice((0, 0, 1, 2))
    pods = {
        f"u{index}-{i}": PodUsage(
            f"u{index}-{i}",
            f"ns/p{i}",
            memory=1000,
            cores=rng.choice((0, 10)),
            group=rng.choice(("", "default/g1", "default/g2")),
            labels=rng.choice(LABELS),
        )
        for i in range(used_num)
    }
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        type=rng.choice(("NVIDIA-A100", "NVIDIA-H100", "Tesla-A100")),
        memory=memory,
        split_count=rng.choice((1, 2, 4)),
        health=rng.random() > 0.1,
        mode=k.MODE_MPS if rng.random() < 0.15 else k.MODE_HAMI_CORE,  # (mps: one-GPU containers only)
        used_num=used_num,
        used_memory=0 if not used_num else rng.choice((1000, 8000, memory - 2000)),
        used_cores=0 if not used_num else rng.choice((0, 30, 100)),
        pods=pods,
    )


def _annotations(rng: random.Random) -> dict[str, str]:
    notes: dict[str, str] = {}
    if rng.random() < 0.2:
        notes[k.VGPU_MODE] = rng.choice((k.MODE_HAMI_CORE, k.MODE_MPS))
    if rng.random() < 0.15:
        notes[k.VGPU_USE_UUID] = ",".join(f"GPU-{i}" for i in rng.sample(range(8), 5))
    if rng.random() < 0.15:
        notes[k.VGPU_NOUSE_UUID] = f"GPU-{rng.randrange(8)}"
    if rng.random() < 0.15:
        notes[k.USE_GPUTYPE if rng.random() < 0.5 else k.NOUSE_GPUTYPE] = rng.choice(("A100", "H100"))
    if rng.random() < 0.25:
        notes[k.VGPU_PODGROUP_POLICY] = k.PODGROUP_POLICY_SPREAD
        notes[k.KUBE_GROUP_NAME] = rng.choice(("g1", "g2"))
    return notes


def _pod(rng: random.Random, n: int) -> dict[str, object]:
    containers = []
    for c in range(rng.choice((1, 1, 2))):
        limits = {NUM: str(rng.choice((2, 2, 3, 4)))}
        if rng.random() < 0.3:
            limits[PCT] = str(rng.choice((25, 50, 100)))
        else:
            limits[MEM] = str(rng.choice((2000, 8000, 15000)))
        limits[CORES] = str(rng.choice((0, 0, 30, 100)))
        containers.append(container(f"c{c}", limits))
    return pod(f"p{n}", containers, annotations=_annotations(rng), labels=rng.choice(LABELS))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_topology_that_rates_every_set_alike_changes_nothing(policy: str) -> None:
    rng = random.Random(f"topology-rules-{policy}")
    outcomes = {True: 0, False: 0}
    for n in range(3000):
        cards = [_card(rng, index) for index in range(rng.choice((4, 8, 8)))]
        flat = Topology.build(range(len(cards)), [0] * len(cards), lambda a, b: Link("NV", 4))
        the_pod = _pod(rng, n)
        requests = parse_vgpu_requests(the_pod)
        rules = EXCLUSIVE_RULES if rng.random() < 0.5 else ()
        plain = fit_vgpu(cards, requests, the_pod, policy, exclusive_rules=rules)
        linked = fit_vgpu(cards, requests, the_pod, policy, exclusive_rules=rules, topology=flat)
        assert linked == plain, (cards, the_pod, rules)
        outcomes[plain.ok] += 1
    assert min(outcomes.values()) >= 500, outcomes  # both decisions, often
