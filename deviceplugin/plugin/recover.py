"""Rebuilds the ledger that `Ledger.open` found unusable and moved aside, from what kubelet and the
API server still know: kubelet's pod-resources `List` names each container of an active pod that
holds devices, and which device IDs; the pod's annotations say what the scheduler chose for it.
Each allocator serves those containers again on paper (`PodAllocator.rebuild`): their rows come
back with the GPUs, memory, cores and response they were given and kubelet's device IDs, and
what the scheduler books for their pods is corrected through the outbox, as after a swap.

What cannot come back, each named in the log and in a `LedgerRebuilt` Event on the node: a
container whose pod the API server no longer binds to the node, or whose pod's annotations no
longer place it (removed, changed, unreadable, naming a GPU the node lacks or finds unhealthy).
Lost without a trace: rows kubelet does not list (run-to-completion init containers, finished
pods: they hold nothing), released rows, and the unsent patches of the outbox (the bookings are
recomputed; the release of Volcano's node lock is not, and the lock expires).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from deviceplugin.ledger import Allocation
from deviceplugin.logs import get_log
from deviceplugin.plugin.podresources import Listing

log = get_log(__name__)


class Rebuilder(Protocol):
    def rebuild(self, listing: Listing) -> tuple[list[Allocation], list[str]]: ...


def rebuild_ledger(
    replaced: Path | None, listing: Listing, allocators: Iterable[Rebuilder], report: Callable[[str], None]
) -> list[Allocation]:
    """Rebuild every allocator's rows; `report(message)` gets the outcome in words. Returns the rows.
    `replaced` None: the ledger was missing at start (a new node, or a state dir wiped), reported
    only when kubelet shows containers holding the node's devices."""
    rows: list[Allocation] = []
    lost: list[str] = []
    for allocator in allocators:
        found, missing = allocator.rebuild(listing)
        rows += found
        lost += missing
    if replaced is None and not rows and not lost:
        return rows  # a new node: nothing was lost
    for why in lost:
        log.warning("allocation not rebuilt", reason=why)
    log.warning("ledger rebuilt", rows=len(rows), lost=len(lost), unusable_file=str(replaced or ""))
    cause = (
        "was missing at start (a new one was started)"
        if replaced is None
        else f"could not be used and was moved aside as {replaced}"
    )
    message = (
        f"the allocation ledger {cause}; {len(rows)} "
        "allocation(s) rebuilt from kubelet's pod-resources and the pods' annotations"
    )
    report(message + (f"; {len(lost)} could not be: {'; '.join(lost)}" if lost else ""))
    return rows
