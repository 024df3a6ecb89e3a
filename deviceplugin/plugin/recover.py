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
    replaced: Path, listing: Listing, allocators: Iterable[Rebuilder], report: Callable[[str], None]
) -> list[Allocation]:
    """Rebuild every allocator's rows; `report(message)` gets the outcome in words. Returns the rows."""
    rows: list[Allocation] = []
    lost: list[str] = []
    for allocator in allocators:
        found, missing = allocator.rebuild(listing)
        rows += found
        lost += missing
    for why in lost:
        log.warning("allocation not rebuilt", reason=why)
    log.warning("ledger rebuilt", rows=len(rows), lost=len(lost), unusable_file=str(replaced))
    message = (
        f"the allocation ledger could not be used and was moved aside as {replaced}; {len(rows)} "
        "allocation(s) rebuilt from kubelet's pod-resources and the pods' annotations"
    )
    report(message + (f"; {len(lost)} could not be: {'; '.join(lost)}" if lost else ""))
    return rows
