"""Which ledger rows kubelet's pod-resources records contradict, and when re-keying them is safe."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from deviceplugin.api import podresources_pb2 as pr
from deviceplugin.ledger import Allocation, GpuShare, Move, Patch
from deviceplugin.plugin.podresources import Listing
from deviceplugin.plugin.swaps import apply_moves, booking_patches, describe, plan_moves, replaced

MEM = "volcano.sh/gpu-memory"
Obj = dict[str, Any]
UIDS = {("ml", name): f"uid-{name}" for name in ("a", "b", "c")}


def row(pod: str, gpu: int, ids: tuple[str, ...], container: str = "main") -> Allocation:
    return Allocation(f"uid-{pod}", "ml", pod, container, MEM, (GpuShare(f"GPU-{gpu}", gpu, 100),), ids, b"")


def listing(*held: tuple[str, str, tuple[str, ...]]) -> Listing:
    """(pod, container, device IDs) as kubelet lists them, one entry per device."""
    pods: dict[str, list[pr.ContainerResources]] = {}
    for pod, container, ids in held:
        devices = [pr.ContainerDevices(resource_name=MEM, device_ids=[d]) for d in ids]
        pods.setdefault(pod, []).append(pr.ContainerResources(name=container, devices=devices))
    return Listing(
        pr.ListPodResourcesResponse(
            pod_resources=[pr.PodResources(name=p, namespace="ml", containers=c) for p, c in pods.items()]
        )
    )


def plan(
    rows: list[Allocation], listed: Listing, finished: Collection[str] = (), *, settled: bool = False
) -> tuple[set[tuple[str, str]], set[str]]:
    """The moves as (from UID, to UID), and the UIDs whose rows are confirmed."""
    live = {(r.pod_uid, r.container, r.resource) for r in rows}
    found = plan_moves(
        rows,
        live,
        listed,
        lambda ns, name: UIDS.get((ns, name)),
        lambda uid: uid in finished,
        settled=lambda: settled,
    )
    return {(m.key[0], m.pod_uid) for m in found.moves}, {key[0] for key in found.confirmed}


A0, B1 = row("a", 0, ("0-1", "0-2")), row("b", 1, ("1-1", "1-2"))


def test_rows_kubelet_lists_as_recorded_are_confirmed() -> None:
    assert plan([A0, B1], listing(("a", "main", ("0-1", "0-2")), ("b", "main", ("1-1", "1-2")))) == (
        set(),
        {"uid-a", "uid-b"},
    )


def test_a_closed_swap_moves_both_rows() -> None:
    listed = listing(("b", "main", ("0-1", "0-2")), ("a", "main", ("1-1", "1-2")))
    assert plan([A0, B1], listed) == ({("uid-a", "uid-b"), ("uid-b", "uid-a")}, set())


def test_a_closed_swap_gives_each_row_to_the_container_kubelet_lists_with_its_devices() -> None:
    listed = listing(("b", "worker", ("0-1", "0-2")), ("a", "main", ("1-1", "1-2")))
    b1 = row("b", 1, ("1-1", "1-2"), container="worker")
    found = plan_moves(
        [A0, b1],
        {(r.pod_uid, r.container, r.resource) for r in (A0, b1)},
        listed,
        lambda ns, name: UIDS.get((ns, name)),
        lambda uid: False,
        settled=lambda: False,
    )
    assert sorted(found.moves, key=lambda m: m.key) == [
        Move(("uid-a", "main", MEM), "uid-b", "ml", "b", "worker"),
        Move(("uid-b", "worker", MEM), "uid-a", "ml", "a", "main"),
    ]
    after = apply_moves([A0, b1, B1], found.moves)  # B1 is no move's: as it was
    assert [(r.pod_uid, r.namespace, r.pod_name, r.container, r.gpus) for r in after] == [
        ("uid-b", "ml", "b", "worker", A0.gpus),
        ("uid-a", "ml", "a", "main", b1.gpus),
        ("uid-b", "ml", "b", "main", B1.gpus),
    ]


def test_an_open_swap_waits_for_the_other_pods_allocate() -> None:
    """b was served as a; a is still to come: giving the row to b now would let a be served a's
    placement again, which b's container already has."""
    listed = listing(("b", "main", ("0-1", "0-2")))
    assert plan([A0], listed) == (set(), set())
    assert plan([A0], listed, finished={"uid-a"}) == ({("uid-a", "uid-b")}, set())  # a never comes


def test_a_move_onto_a_container_that_holds_a_row_waits() -> None:
    listed = listing(("b", "main", ("0-1", "0-2")))
    assert plan([A0, B1], listed, finished={"uid-a"}) == (set(), set())


def test_a_swap_whose_other_side_is_gone_is_closed() -> None:
    """b was served as a and a as b; a is gone, so nobody holds the devices of b's row: b's
    container gets a's row, and b's row goes to a (released with it). Not while an Allocate
    answer may still be on its way to a listed container (its IDs not yet recorded)."""
    listed = listing(("b", "main", ("0-1", "0-2")))
    assert plan([A0, B1], listed, finished={"uid-a"}, settled=True) == (
        {("uid-a", "uid-b"), ("uid-b", "uid-a")},
        set(),
    )
    assert plan([A0, B1], listed, finished={"uid-a"}, settled=False) == (set(), set())
    assert plan([A0, B1], listed, settled=True) == (set(), set())  # a may still be served


def test_a_longer_chain_whose_first_pod_is_gone_is_closed() -> None:
    c2 = row("c", 2, ("2-1", "2-2"))
    listed = listing(("c", "main", ("0-1", "0-2")), ("b", "main", ("2-1", "2-2")))  # a gone
    assert plan([A0, B1, c2], listed, finished={"uid-a"}, settled=True) == (
        {("uid-a", "uid-c"), ("uid-c", "uid-b"), ("uid-b", "uid-a")},
        set(),
    )


def test_rows_kubelet_does_not_list_are_left_alone() -> None:
    init = row("c", 0, ("0-7",), container="setup")  # a run-to-completion init container
    split = row("c", 1, ("1-5", "1-6"))
    listed = listing(("a", "main", ("1-5",)), ("b", "main", ("1-6",)))
    assert plan([init, split], listed) == (set(), set())


def test_an_exchange_of_equal_placements_is_not_a_swap() -> None:
    twin = row("b", 0, ("0-3", "0-4"))
    moves = [
        Move(("uid-a", "main", MEM), "uid-b", "ml", "b", "main"),
        Move(("uid-b", "main", MEM), "uid-a", "ml", "a", "main"),
    ]
    assert replaced([A0, twin], moves) == []
    assert [m.pod_uid for m, _ in replaced([A0, B1], moves)] == ["uid-b", "uid-a"]


def _pod(name: str, notes: dict[str, str], *, namespace: str | None = "ml", phase: str = "Running") -> Obj:
    meta: dict[str, object] = {"name": name, "uid": f"uid-{name}", "annotations": notes}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta, "status": {"phase": phase}}


def _index_of(pod: Mapping[str, object], rows: Sequence[Allocation]) -> dict[str, str]:
    """A booking: the GPU index of the pod's rows, as the gpushare allocator books it."""
    return {"volcano.sh/gpu-index": ",".join(str(share.index) for r in rows for share in r.gpus)}


def test_booking_patches_carry_only_what_differs_for_live_pods() -> None:
    pods = {
        "uid-a": _pod("a", {"volcano.sh/gpu-index": "1", "other": "kept"}),  # booked on 1, holds 0
        "uid-b": _pod("b", {"volcano.sh/gpu-index": "1"}, namespace=None),  # right already
        "uid-c": _pod("c", {"volcano.sh/gpu-index": "1"}, phase="Succeeded"),  # finished: left alone
    }
    rows = [row("a", 0, ("0-1",)), row("b", 1, ("1-1",)), row("c", 0, ("0-2",))]
    patches = booking_patches(["uid-a", "uid-b", "uid-c", "uid-gone"], rows, pods, _index_of)
    assert patches == [Patch("pod", "ml", "a", {"volcano.sh/gpu-index": "0"}, "uid-a")]
    moved = {**pods, "uid-b": _pod("b", {"volcano.sh/gpu-index": "0"}, namespace=None)}
    assert booking_patches(["uid-b"], rows, moved, _index_of) == [
        Patch("pod", "default", "b", {"volcano.sh/gpu-index": "1"}, "uid-b")  # no namespace: default
    ]
    assert booking_patches(["uid-a"], rows, pods, lambda pod, rows: None) == []  # nothing to book


def test_the_event_text_names_both_sides_the_gpus_and_what_was_rewritten() -> None:
    shares = (GpuShare("GPU-0", 0, 100, 25), GpuShare("GPU-1", 1, 50))
    served = Allocation("uid-a", "ml", "a", "main", MEM, shares, ("0-1",), b"")
    move = Move(("uid-a", "main", MEM), "uid-b", "ml", "b", "worker")
    mine = Patch("pod", "ml", "b", {"volcano.sh/gpu-index": "0,1"}, "uid-b")
    other = Patch("pod", "ml", "a", {"volcano.sh/gpu-index": "2"}, "uid-a")
    base = (
        "kubelet's pod-resources shows container 'worker' holding the volcano.sh/gpu-memory devices this "
        "node served as pod ml/a container 'main': GPU 0 (100 MiB, 25% cores), GPU 1 (50 MiB, 0% cores). "
        "Pods asking the same device count were admitted in another order than they could be told apart; "
        "the ledger now records them for this pod"
    )
    assert describe(move, served, [other]) == base + "."
    fixed = ", and volcano.sh/gpu-index=0,1 was written so the scheduler books what the container has."
    assert describe(move, served, [other, mine]) == base + fixed
    bare = Allocation("uid-a", "ml", "a", "main", MEM, (), ("0-1",), b"")
    assert ": no GPU." in describe(move, bare, [])
