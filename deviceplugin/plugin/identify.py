"""Which of several candidate pods kubelet is admitting, for an Allocate that names only a device
count (SPEC §3). Kubelet admits one pod at a time and allocates a container's resources one after
another, each recorded before the next Allocate; from that:

- pod-resources `List` shows the pod under admission (kubelet adds it to its pod manager first)
  and, for each container, the devices of the resources allocated so far. A candidate that is not
  listed, or whose container already holds devices of this resource, is not the one; a candidate
  whose container holds devices of *another* resource but not of this one is mid-admission.
- the ledger: a candidate whose container this daemon already served for another resource (say
  `vgpu-memory`, whose device count is the container's memory request) but not for this one is
  the container kubelet is working on.

Each narrowing returns the candidates it keeps, earliest first; an empty answer tells nothing.
`Identifier` applies them in that order and falls back to the earliest candidate (`pending`).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from deviceplugin.logs import get_log
from deviceplugin.plugin.pending import ContainerNeed, PendingPod
from deviceplugin.plugin.podresources import Listing, connect, list_with

log = get_log(__name__)

C = TypeVar("C", bound=tuple[PendingPod, ContainerNeed])

LIST_TIMEOUT_S = 2.0
# GetPreferredAllocation and the Allocate that follows it for the same container see the same
# kubelet state: one List serves both when the Allocate comes this soon.
LISTING_REUSE_S = 1.0


def by_listing(candidates: Sequence[C], listing: Listing, resource: str) -> list[C]:
    """The candidates kubelet lists without devices of `resource` in the container; those whose
    container holds another resource's devices, when there are any."""
    admitting = []
    for candidate in candidates:
        pod, need = candidate[0], candidate[1]
        if (pod.namespace, pod.name) not in listing.pods:
            continue
        if resource not in listing.holding(pod.namespace, pod.name, need.name):
            admitting.append(candidate)
    started = [c for c in admitting if listing.holding(c[0].namespace, c[0].name, c[1].name)]
    return started or admitting


def by_siblings(candidates: Sequence[C], containers: Container[tuple[str, str]]) -> C | None:
    """The earliest candidate whose container the ledger holds for another resource
    (`containers`: the ledger's `containers_held_except`): the later ones are not looked up
    (each look-up takes the ledger's lock, and the earliest is the one chosen)."""
    return next((c for c in candidates if (c[0].uid, c[1].name) in containers), None)


class Identifier:
    """Chooses among the candidates of one resource's request, counting in `counts` (resource,
    signal) what decided: "pod-resources", "ledger", "arrival" (no signal: kubelet's admission
    order as the daemon saw it) or "same-placement" (every candidate would get the same)."""

    def __init__(
        self,
        resource: str,
        socket: Path | None,
        counts: Counter[tuple[str, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource = resource
        self.socket = socket  # kubelet's pod-resources socket; None: not consulted
        self.counts = counts
        self.clock = clock
        self._kept: tuple[float, Listing | None] | None = None  # a preferred call's List, for its Allocate
        self._channel: grpc.Channel | None = None  # kept open: it reconnects after a kubelet restart
        self._unreachable = False

    def pick(
        self,
        candidates: Sequence[C],
        siblings: Container[tuple[str, str]],
        deadline: float,
        *,
        distinct: bool,
        keep: bool,
        more: Callable[[], Sequence[C]] = tuple,
    ) -> tuple[C, bool]:
        """The candidate kubelet is admitting, as far as can be told, and whether kubelet's own
        records told it. `candidates`: the earliest few; `more()`: the later ones, looked at when
        none of those is the one; `siblings`: the (pod UID, container) the ledger holds for another
        resource, false when it holds none; `distinct`: the candidates would not all get the same;
        `keep`: hold the List answer for the Allocate that follows."""
        if len(candidates) == 1:
            return candidates[0], True
        if not distinct:
            return self._decided(candidates, "same-placement"), False
        later: list[Sequence[C]] = []

        def rest() -> Sequence[C]:
            if not later:
                later.append(more())
            return later[0]

        listing = self._listing(deadline, keep)
        if listing is not None and (
            kept := by_listing(candidates, listing, self.resource)
            or by_listing(rest(), listing, self.resource)
        ):
            return self._decided(kept, "pod-resources"), len(kept) == 1
        # No other resource holds a row (every share or number node): the ledger tells nothing, so
        # the later candidates are not walked for it. Otherwise each candidate is looked up.
        if siblings and (held := by_siblings(candidates, siblings) or by_siblings(rest(), siblings)):
            return self._decided((held,), "ledger"), False
        return self._decided(candidates, "arrival"), False

    def _decided(self, kept: Sequence[C], signal: str) -> C:
        self.counts[(self.resource, signal)] += 1
        return kept[0]

    def _listing(self, deadline: float, keep: bool) -> Listing | None:
        now = self.clock()
        kept, self._kept = self._kept, None
        if not keep and kept is not None and now - kept[0] <= LISTING_REUSE_S:
            return kept[1]
        listing = self._read(min(LIST_TIMEOUT_S, deadline - now))
        if keep:
            self._kept = (now, listing)
        return listing

    def _read(self, timeout_s: float) -> Listing | None:
        if self.socket is None or timeout_s <= 0:
            return None
        # What the call would answer, without a gRPC call's CPU; access() raises no exception
        # for a missing file, as Path.exists's stat does (a third of the time).
        if not os.access(self.socket, os.F_OK):
            self._failed(grpc.StatusCode.UNAVAILABLE)
            return None
        if self._channel is None:
            self._channel = connect(self.socket)
        try:
            listing = list_with(self._channel, timeout_s)
        except grpc.RpcError as err:  # unreachable, or over kubelet's rate limit: decide without it
            self._failed(err.code())
            return None
        self._unreachable = False
        return listing

    def _failed(self, code: grpc.StatusCode) -> None:
        (log.debug if self._unreachable else log.warning)(
            "pod-resources List failed; choosing the pod by arrival order",
            resource=self.resource,
            error=code.name,
        )
        self._unreachable = True
