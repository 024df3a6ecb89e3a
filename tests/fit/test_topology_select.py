"""Topology-aware card choice for multi-GPU requests (docs/topology.md, "Choosing cards"): a
gpu-number or vgpu-number pod takes the best-linked of the cards its policy rates alike; the policy
still decides which cards those are, and the topology never changes whether a pod fits, its score
or its device count (so the quick fit, which reads no topology, still agrees); compat="volcano"
and a node without a topology choose as before."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from deviceplugin.fit import GpuState, fit_vgpu, parse_vgpu_requests
from deviceplugin.fit import keys as k
from deviceplugin.fit.families import family_of
from deviceplugin.fit.gpushare import fit_number
from deviceplugin.fit.linked import linked_choice
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, FitResult, PodUsage
from deviceplugin.fit.policy import policy_of
from deviceplugin.fit.topology import Link, Topology, best_set, parse_link
from tests.fit.builders import MEM, NUM, container, gpus, pod
from tests.fit.test_quick_fit import POLICIES, _node, _pod

LinkRule = Callable[[int, int], str]


def topology(count: int, numa: Callable[[int], int], link: LinkRule) -> Topology:
    return Topology.build(range(count), [numa(g) for g in range(count)], lambda a, b: parse_link(link(a, b)))


def nvlink_quads(quads: tuple[frozenset[int], ...]) -> Topology:
    """8 GPUs in two fully NVLinked quads (DGX-1-like), one per socket; across quads: SYS."""

    def quad(g: int) -> int:
        return next(n for n, members in enumerate(quads) if g in members)

    return topology(8, quad, lambda a, b: "NV2" if quad(a) == quad(b) else "SYS")


def pcie_two_sockets() -> Topology:
    """8 GPUs, two per PCIe switch, two switches per socket: PIX, NODE, SYS."""
    return topology(
        8,
        lambda g: g // 4,
        lambda a, b: "PIX" if a // 2 == b // 2 else "NODE" if a // 4 == b // 4 else "SYS",
    )


INTERLEAVED = nvlink_quads((frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})))


def number_cards(count: int, busy: tuple[int, ...] = (), unhealthy: tuple[int, ...] = ()) -> list[GpuState]:
    cards = [GpuState(index=i, uuid=f"GPU-{i}", type="A100", memory=0, split_count=1) for i in range(count)]
    for index in busy:
        cards[index].pods = {"other": PodUsage("other", "ns/other")}
        cards[index].used_num = 1
    for index in unhealthy:
        cards[index].health = False
    return cards


def number_pod(count: int) -> dict[str, object]:
    return pod("job", [container("main", {k.GPU_NUMBER: str(count)})])


def indices(result: FitResult) -> list[int]:
    assert result.ok, result.reason
    chosen = [device.index for placed in result.devices for device in placed]
    return [index for index in chosen if index is not None]


def vgpu_fit(cards: list[GpuState], limits: dict[str, str], policy: str, top: Topology | None) -> FitResult:
    the_pod = pod("job", [container("main", limits)])
    return fit_vgpu(cards, parse_vgpu_requests(the_pod), the_pod, policy, topology=top)


# --- gpu-number -------------------------------------------------------------------------------


def test_a_four_gpu_pod_takes_an_nvlink_quad_not_the_first_four_cards() -> None:
    assert indices(fit_number(number_cards(8), number_pod(4))) == [0, 1, 2, 3]  # no topology: as before
    assert indices(fit_number(number_cards(8), number_pod(4), topology=INTERLEAVED)) == [0, 2, 4, 6]


def test_busy_and_unhealthy_cards_are_never_chosen_for_their_links() -> None:
    """Quad {0,2,4,6} has a busy card, so the whole idle quad {1,3,5,7} wins; with one of those
    unhealthy too no quad is whole, and the set crossing sockets least is taken."""
    assert indices(fit_number(number_cards(8, busy=(2,)), number_pod(4), topology=INTERLEAVED)) == [
        1,
        3,
        5,
        7,
    ]
    broken = number_cards(8, busy=(2,), unhealthy=(5,))
    chosen = indices(fit_number(broken, number_pod(4), topology=INTERLEAVED))
    assert not {2, 5} & set(chosen)
    assert INTERLEAVED.set_score(chosen) == max(
        INTERLEAVED.set_score(cards) for cards in ([0, 4, 6, 1], [1, 3, 7, 0], [0, 1, 3, 4])
    )


def test_a_pcie_node_keeps_the_pod_on_one_socket() -> None:
    """Cards 0 and 2 are busy: of the idle 1,3,4,5,6,7 the first four span both sockets (SYS);
    the four on socket 1 (two switches, NODE) are taken."""
    cards = number_cards(8, busy=(0, 2))
    assert indices(fit_number(cards, number_pod(4))) == [1, 3, 4, 5]
    assert indices(fit_number(cards, number_pod(4), topology=pcie_two_sockets())) == [4, 5, 6, 7]
    # Two GPUs: one switch beats the lowest indices.
    assert indices(fit_number(cards, number_pod(2), topology=pcie_two_sockets())) == [4, 5]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_number_score_and_decision_ignore_the_topology(policy: str) -> None:
    """Every idle card scores alike under binpack and spread (the node score counts idle cards),
    so the links choose freely and the node's score is the policy's."""
    cards = number_cards(8, busy=(2,))
    plain = fit_number(cards, number_pod(4), policy=policy)
    linked = fit_number(cards, number_pod(4), policy=policy, topology=INTERLEAVED)
    assert linked.score == plain.score
    assert not fit_number(cards, number_pod(8), policy=policy, topology=INTERLEAVED).ok


def test_compat_volcano_keeps_volcanos_random_choice() -> None:
    chosen = [
        indices(
            fit_number(number_cards(8), number_pod(4), compat="volcano", rng=random.Random(7), topology=t)
        )
        for t in (None, INTERLEAVED)
    ]
    assert chosen[0] == chosen[1]


def test_a_topology_missing_a_card_leaves_the_choice_to_the_policy() -> None:
    """A published topology that does not describe every candidate (a GPU added since) is not
    guessed at."""
    four = topology(4, lambda g: 0, lambda a, b: "NV4" if {a, b} == {1, 3} else "SYS")
    assert indices(fit_number(number_cards(6), number_pod(2), topology=four)) == [0, 1]
    assert indices(fit_number(number_cards(4), number_pod(2), topology=four)) == [1, 3]


def test_the_number_family_passes_the_topology() -> None:
    family = family_of("number")
    the_pod = number_pod(4)
    request = family.request(the_pod, None)
    result = family.fit(
        number_cards(8),
        the_pod,
        request,
        policy="binpack",
        compat=None,
        config=DEFAULT_VGPU_CONFIG,
        topology=INTERLEAVED,
    )
    assert indices(result) == [0, 2, 4, 6]


# --- vgpu-number ------------------------------------------------------------------------------

# Four cards: NVLink pairs (0,3) and (1,2), everything else through the host bridge.
PAIRS = topology(4, lambda g: 0, lambda a, b: "NV4" if {a, b} in ({0, 3}, {1, 2}) else "PHB")


def shared(cards: list[GpuState], index: int, memory: int) -> list[GpuState]:
    cards[index].pods = {"t": PodUsage("t", "ns/t", memory=memory)}
    cards[index].used_num, cards[index].used_memory = 1, memory
    return cards


def test_vgpu_number_two_takes_an_nvlinked_pair() -> None:
    """No policy visits the highest index first: 3 and 2, across the host bridge; with the
    topology every card is rated alike, and the first NVLink pair in that order (3, 0) wins."""
    limits = {NUM: "2", MEM: "4000"}
    assert indices(vgpu_fit(gpus(*[32000] * 4), limits, "", None)) == [3, 2]
    assert indices(vgpu_fit(gpus(*[32000] * 4), limits, "", PAIRS)) == [3, 0]


def test_binpack_keeps_its_fullest_card_and_takes_its_nvlink_partner() -> None:
    """Binpack takes the used card 1 first whatever the links; of the idle cards, which it rates
    alike, the one NVLinked to card 1 (2) replaces the lowest index (0). The score is binpack's."""
    limits = {NUM: "2", MEM: "4000"}
    plain = vgpu_fit(shared(gpus(*[32000] * 4), 1, 10000), limits, "binpack", None)
    linked = vgpu_fit(shared(gpus(*[32000] * 4), 1, 10000), limits, "binpack", PAIRS)
    assert indices(plain) == [1, 0]
    assert indices(linked) == [1, 2]
    assert linked.score == plain.score


def test_binpack_never_trades_its_fuller_cards_for_a_link() -> None:
    """Cards 1 and 0 hold the most memory: binpack takes both although neither pair links by
    NVLink, and the NVLinked idle pairs are passed over."""
    limits = {NUM: "2", MEM: "4000"}
    cards = shared(shared(gpus(*[32000] * 4), 1, 10000), 0, 9000)
    assert indices(vgpu_fit(cards, limits, "binpack", PAIRS)) == [1, 0]


def test_spread_takes_idle_cards_first_and_links_among_them() -> None:
    """Spread prefers the idle cards 0, 2, 3 over the shared card 1 (which is NVLinked to 2): the
    pair is chosen among the idle ones, (0, 3). Its score is spread's: two idle cards."""
    limits = {NUM: "2", MEM: "4000"}
    plain = vgpu_fit(shared(gpus(*[32000] * 4), 1, 10000), limits, "spread", None)
    linked = vgpu_fit(shared(gpus(*[32000] * 4), 1, 10000), limits, "spread", PAIRS)
    assert indices(plain) == [0, 2]
    assert indices(linked) == [0, 3]
    assert linked.score == plain.score == 200.0


def test_cards_without_room_are_not_chosen_for_their_links() -> None:
    """Card 0 has no memory left for the request: its NVLink partner 3 pairs with nothing better
    than the host bridge, and the other NVLink pair (2, 1) is taken."""
    limits = {NUM: "2", MEM: "4000"}
    cards = shared(gpus(*[32000] * 4), 0, 30000)
    assert indices(vgpu_fit(cards, limits, "", PAIRS)) == [2, 1]


def test_each_container_takes_its_own_best_pair() -> None:
    """Two containers of two vGPUs each, on one card's worth of memory per vGPU: the first takes
    the pair (3, 0), the second the pair left, (2, 1)."""
    the_pod = pod("job", [container(name, {NUM: "2", MEM: "32000"}) for name in ("a", "b")])
    result = fit_vgpu(gpus(*[32000] * 4), parse_vgpu_requests(the_pod), the_pod, topology=PAIRS)
    assert [[d.index for d in placed] for placed in result.devices] == [[3, 0], [2, 1]]


def test_vgpu_compat_volcano_and_single_gpus_ignore_the_topology() -> None:
    the_pod = pod("job", [container("main", {NUM: "2", MEM: "4000"})])
    for policy in POLICIES:
        volcano = [
            fit_vgpu(
                gpus(*[32000] * 4),
                parse_vgpu_requests(the_pod, compat="volcano"),
                the_pod,
                policy,
                "volcano",
                topology=t,
            )
            for t in (None, PAIRS)
        ]
        assert volcano[0] == volcano[1]
    one = [indices(vgpu_fit(gpus(*[32000] * 4), {NUM: "1", MEM: "4000"}, "", t)) for t in (None, PAIRS)]
    assert one == [[3], [3]]


# --- the choice itself ------------------------------------------------------------------------


def test_linked_choice_keeps_the_policys_slots() -> None:
    """Tiers: card 5 alone is preferred; 1, 2 and 3 are rated alike. The pool's pick fills the
    slot of the policy's last card; the preferred card keeps its place."""
    links = {frozenset({5, 3}): "NV4"}
    top = Topology.build([1, 2, 3, 5], [0] * 4, lambda a, b: parse_link(links.get(frozenset({a, b}), "SYS")))
    assert linked_choice(top, [5, 1, 2, 3], ["a", "b", "b", "b"], 2) == (5, 3)
    assert linked_choice(None, [5, 1, 2, 3], ["a", "b", "b", "b"], 2) == (5, 1)
    assert linked_choice(top, [5, 1, 2, 3], ["a", "b", "b", "b"], 1) == (5,)


def test_best_set_scores_the_kept_cards_links_too() -> None:
    """Cards 1 and 2 are NVLinked to each other, 3 only to the kept card 0: with 0 kept, 3 wins
    (the set's worst link is what counts), without it the pair (1, 2)."""
    links = {frozenset({1, 2}): "NV12", frozenset({0, 3}): "NV2"}
    top = Topology.build(range(4), [0] * 4, lambda a, b: parse_link(links.get(frozenset({a, b}), "SYS")))
    assert best_set(top, [1, 2, 3], 1, [0]) == (3,)
    assert best_set(top, [1, 2, 3], 2, []) == (1, 2)
    assert best_set(top, [1, 2, 3], 3, [0]) == (1, 2, 3)  # nothing to choose
    # Many cards: the greedy search still finds the kept card's partners.
    big = Topology.build(range(16), [0] * 16, lambda a, b: Link("NV", 4) if a // 4 == b // 4 else Link("SYS"))
    assert best_set(big, [*range(4), *range(5, 16)], 3, [4]) == (5, 6, 7)


# --- the topology never changes the decision, the score or the device count -------------------

RANKS = ("SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV4", "NV12")


def _random_topology(rng: random.Random, cards: list[GpuState]) -> Topology:
    gpus_ = sorted(card.index for card in cards)
    return Topology.build(
        gpus_, [rng.choice((0, 1)) for _ in gpus_], lambda a, b: parse_link(rng.choice(RANKS))
    )


def _vgpu_node(rng: random.Random) -> list[GpuState]:
    """Roomier cards than `test_quick_fit`'s, so that multi-GPU pods fit often."""
    count = rng.choice((2, 4, 8, 8))
    indices_ = rng.sample(range(10), count) if rng.random() < 0.2 else list(range(count))
    cards = []
    for index in indices_:
        memory = rng.choice((32000, 32000, 81559))
        used_num = rng.choice((0, 0, 0, 1, 2))
        cards.append(
            GpuState(
                index=index,
                uuid=f"GPU-{index}",
                type=rng.choice(("NVIDIA-A100", "NVIDIA-H100")),
                memory=memory,
                split_count=rng.choice((2, 4, 10)),
                health=rng.random() > 0.05,
                used_num=used_num,
                used_memory=0 if not used_num else rng.choice((1000, 8000, memory // 2)),
                used_cores=0 if not used_num else rng.choice((0, 30, 100)),
                pods={f"u{i}": PodUsage(f"u{i}", f"ns/p{i}") for i in range(used_num)},
            )
        )
    rng.shuffle(cards)
    return cards


def _multi_gpu_pod(rng: random.Random, strategy: str, n: int) -> dict[str, object]:
    """`test_quick_fit`'s pods, most asking several GPUs per container."""
    the_pod = _pod(rng, strategy, n)
    resource = k.GPU_NUMBER if strategy == "number" else NUM
    for each in the_pod["spec"]["containers"]:  # type: ignore[index]
        if rng.random() < 0.8:
            each["resources"]["limits"][resource] = str(rng.choice((2, 3, 4)))
    return the_pod


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("strategy", ["number", "vgpu"])
def test_fit_with_a_topology_decides_and_scores_as_without_and_as_quick(strategy: str, policy: str) -> None:
    family = family_of(strategy)
    chosen = policy_of(policy, False)
    rng = random.Random(f"topology-{strategy}-{policy}")
    changed = fits = 0
    for n in range(1500):
        cards = _node(rng) if strategy == "number" else _vgpu_node(rng)
        the_pod = _multi_gpu_pod(rng, strategy, n)
        top = _random_topology(rng, cards)
        request = family.request(the_pod, None)
        if not request.wants:
            continue
        config = DEFAULT_VGPU_CONFIG
        plain = family.fit(cards, the_pod, request, policy=policy, compat=None, config=config)
        linked = family.fit(cards, the_pod, request, policy=policy, compat=None, config=config, topology=top)
        if len(request.containers) > 1:
            # Each container chooses in turn: a later one sees the cards the links gave the
            # earlier, so only one GPU container per pod keeps the policy's outcome exactly.
            assert not linked.ok or all(len({d.index for d in p}) == len(p) for p in linked.devices)
            continue
        assert (linked.ok, linked.score, [len(p) for p in linked.devices]) == (
            plain.ok,
            plain.score,
            [len(p) for p in plain.devices],
        ), (cards, the_pod)
        quick_cards = family.quick_cards(cards, chosen, None)
        if linked.ok and request.quick and quick_cards is not None:
            assert family.quick(quick_cards, request, chosen) == (
                linked.score,
                sum(len(p) for p in linked.devices),
            )
        if linked.ok:
            fits += 1
            changed += linked.devices != plain.devices
            for placed in linked.devices:
                assert len({d.index for d in placed}) == len(placed)  # distinct cards per container
    assert fits >= 300 and changed >= 100, (fits, changed)  # the topology did choose, often
