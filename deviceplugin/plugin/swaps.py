"""Rows whose container kubelet's records contradict, and which of them can be given to their true
owner (SPEC §4: pod-resources `List` is the ground truth).

When two pods ask for the same device count and nothing told them apart at Allocate time, the
first one kubelet admits may have been served as the other: the ledger row says pod A, kubelet's
`List` says pod B holds its device IDs. Re-keying that row to B is only safe once A will never be
served again from the same placement: either A's own Allocate came and was served as someone else
(the rows form a cycle, every placement handed out once) or A is gone. A re-key that would free a
pod still waiting for its Allocate waits for a later pass, when the cycle has closed. When A left
after being served as B, B's row holds A's devices, which nobody holds any more: it goes to A.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from deviceplugin.fit import objects
from deviceplugin.ledger import Allocation, Key, Move, Patch
from deviceplugin.plugin.podresources import Listing

Obj = Mapping[str, object]
Booking = Callable[[Obj, Sequence[Allocation]], Mapping[str, str] | None]


def _key(row: Allocation) -> Key:
    return (row.pod_uid, row.container, row.resource)


def true_owner(row: Allocation, listing: Listing) -> tuple[str, str, str] | None:
    """(namespace, pod, container) that kubelet lists with every device ID of the row; None when
    the row is not (or not wholly) listed, as for a run-to-completion init container."""
    holders = {listing.holder(row.resource, device) for device in row.device_ids}
    if len(holders) != 1:
        return None
    return holders.pop()


@dataclass(frozen=True)
class Plan:
    moves: list[Move]  # safe now
    confirmed: set[Key]  # rows kubelet lists under the container the ledger names


def plan_moves(
    rows: Iterable[Allocation],
    live: Set[Key],
    listing: Listing,
    uid_of: Callable[[str, str], str | None],
    finished: Callable[[str], bool],
    *,
    settled: Callable[[], bool] = lambda: False,
) -> Plan:
    """Checks `rows` against kubelet's records: the re-keys that make them match and are safe
    now, and the rows already right. `live`: every live key of the resource.

    `uid_of(namespace, name)` is the UID of a pod on the node (None when the cache lacks it);
    `finished(uid)`: the pod will get no further Allocate (gone, terminal or terminating);
    `settled()`: no container kubelet lists waits for devices of the resource, so a row whose
    device IDs nobody holds is not on its way to one.
    """
    rows = list(rows)
    plan: dict[Key, Move] = {}
    confirmed = set()
    for row in rows:
        owner = true_owner(row, listing)
        if owner == (row.namespace, row.pod_name, row.container):
            confirmed.add(_key(row))
        elif owner is not None and (uid := uid_of(owner[0], owner[1])) is not None:
            plan[_key(row)] = Move(_key(row), uid, *owner)
    _close_chains(plan, {_key(row): row for row in rows}, listing, finished, settled)
    while True:
        taken = [move.new_key for move in plan.values()]
        unsafe = [
            key
            for key, move in plan.items()
            if (key not in taken and not finished(key[0]))  # it would be served again
            or taken.count(move.new_key) > 1
            or (move.new_key in live and move.new_key not in plan)  # the owner holds a row already
        ]
        if not unsafe:
            return Plan(list(plan.values()), confirmed)
        for key in unsafe:
            del plan[key]


def _close_chains(
    plan: dict[Key, Move],
    rows: Mapping[Key, Allocation],
    listing: Listing,
    finished: Callable[[str], bool],
    settled: Callable[[], bool],
) -> None:
    """A chain of moves that starts at a finished pod's row and ends at a row whose device IDs
    nobody holds (their container is gone: the finished pod's, served as this one) is closed by
    moving that row to the finished pod, which releases it; else the chain would wait forever,
    its containers booked where they do not run."""
    into = {move.new_key: key for key, move in plan.items()}
    for end in [key for key in into if key not in plan and key in rows]:
        start, seen = into[end], {end}
        while start in into and start not in seen:
            seen.add(start)
            start = into[start]
        if start in into or not finished(start[0]):
            continue  # a cycle, or the chain starts with a pod still to be served
        vacated = all(listing.holder(end[2], device) is None for device in rows[end].device_ids)
        if not (vacated and settled()):
            continue
        origin = rows[start]
        plan[end] = Move(end, origin.pod_uid, origin.namespace, origin.pod_name, origin.container)


def apply_moves(rows: Iterable[Allocation], moves: Sequence[Move]) -> list[Allocation]:
    """The rows as they are once `moves` are applied."""
    by_key = {move.key: move for move in moves}
    return [
        row
        if (move := by_key.get(_key(row))) is None
        else dataclasses.replace(
            row,
            pod_uid=move.pod_uid,
            namespace=move.namespace,
            pod_name=move.pod_name,
            container=move.container,
        )
        for row in rows
    ]


def replaced(rows: Iterable[Allocation], moves: Sequence[Move]) -> list[tuple[Move, Allocation]]:
    """The moves that give a container another placement than the ledger recorded for it (an
    exchange of equal placements, as between replicas on one GPU, changes nothing), each with
    the row it moves."""
    by_key = {_key(row): row for row in rows}
    return [
        (move, by_key[move.key])
        for move in moves
        if (held := by_key.get(move.new_key)) is None or held.gpus != by_key[move.key].gpus
    ]


def correction_patches(
    after: Sequence[Allocation], moves: Sequence[Move], pods: Mapping[str, Obj], booking: Booking
) -> list[Patch]:
    """For each live pod the moves touch, the annotations whose value differs from what
    `booking` derives from its rows."""
    touched = dict.fromkeys(uid for move in moves for uid in (move.key[0], move.pod_uid))
    return booking_patches(touched, after, pods, booking)


def booking_patches(
    uids: Iterable[str], rows: Sequence[Allocation], pods: Mapping[str, Obj], booking: Booking
) -> list[Patch]:
    """For each live pod of `uids`, the annotations whose value differs from what `booking`
    derives from its `rows`."""
    patches = []
    for uid in uids:
        pod = pods.get(uid)
        if pod is None or objects.is_terminal(pod):
            continue
        wanted = booking(pod, [row for row in rows if row.pod_uid == uid]) or {}
        notes = objects.annotations_of(pod)
        changed = {key: value for key, value in wanted.items() if notes.get(key) != value}
        if changed:
            meta = objects.metadata(pod)
            namespace = str(meta.get("namespace") or "default")
            patches.append(Patch("pod", namespace, str(meta.get("name")), changed, uid))
    return patches


def describe(move: Move, row: Allocation, patches: Sequence[Patch]) -> str:
    """The Event text for the pod that received `row`."""
    gpus = ", ".join(f"GPU {g.index} ({g.memory} MiB, {g.cores}% cores)" for g in row.gpus) or "no GPU"
    text = (
        f"kubelet's pod-resources shows container {move.container!r} holding the {row.resource} devices "
        f"this node served as pod {row.namespace}/{row.pod_name} container {row.container!r}: {gpus}. "
        "Pods asking the same device count were admitted in another order than they could be told "
        "apart; the ledger now records them for this pod"
    )
    mine = [p for p in patches if (p.namespace, p.name) == (move.namespace, move.pod_name)]
    if mine:
        fixed = ", ".join(f"{key}={value}" for patch in mine for key, value in patch.annotations.items())
        text += f", and {fixed} was written so the scheduler books what the container has"
    return text + "."
