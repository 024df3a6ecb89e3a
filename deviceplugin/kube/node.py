"""Publishes what the scheduler needs to know about this node: annotations and extended resources
in node status. Writes happen only when the wanted state differs from what the node holds, and
follow a change (a GPU's health) at once; failures, conflicts included, are retried with back-off
and the node is read again before the next attempt."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.api import ApiError, Kube, Obj
from deviceplugin.logs import get_log
from deviceplugin.worker import Worker

log = get_log(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 10.0
# Re-check even without a health change, so a change of the wanted state from elsewhere lands.
IDLE_WAIT_S = 1.0


@dataclass(frozen=True)
class NodeState:
    """Annotations (None: remove the key) and status resources (set in capacity and allocatable)."""

    annotations: Mapping[str, str | None] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)

    def annotation_patch(self, node: Obj) -> dict[str, str | None]:
        current = node.get("metadata", {}).get("annotations") or {}
        return {k: v for k, v in self.annotations.items() if current.get(k) != v}

    def status_patch(self, node: Obj) -> dict[str, dict[str, str]]:
        status = node.get("status", {})
        stale = {
            section: {k: v for k, v in self.resources.items() if (status.get(section) or {}).get(k) != v}
            for section in ("capacity", "allocatable")
        }
        return {section: values for section, values in stale.items() if values}


class NodePublisher:
    def __init__(
        self, kube: Kube, node_name: str, wanted: Callable[[], NodeState], health: HealthState
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.wanted = wanted
        self.health = health
        self._published: NodeState | None = None
        self._worker = Worker("node-publisher", self._run, interrupt=health.wake)

    @property
    def published(self) -> bool:
        """The node holds the state wanted at the last check."""
        return self._published is not None and self._published == self.wanted()

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def publish(self, state: NodeState) -> None:
        """Bring the node to `state`, writing only the keys that differ."""
        node = self.kube.get_node(self.node_name)
        annotations = state.annotation_patch(node)
        if annotations:
            self.kube.patch_node(self.node_name, {"metadata": {"annotations": annotations}})
            log.info(
                "node annotations written",
                node=self.node_name,
                **{k: v or "(removed)" for k, v in annotations.items()},
            )
        status = state.status_patch(node)
        if status:
            self.kube.patch_node_status(self.node_name, {"status": status})
            log.info("node status written", node=self.node_name, resources=dict(state.resources))
        self._published = state

    def _run(self) -> None:
        backoff = BACKOFF_START_S
        while not self._worker.stopping.is_set():
            version, _ = self.health.snapshot()
            state = self.wanted()
            if state != self._published:
                try:
                    self.publish(state)
                    backoff = BACKOFF_START_S
                except ApiError as err:
                    self._published = None
                    log.warning("node update failed", node=self.node_name, error=str(err), retry_s=backoff)
                    self._worker.stopping.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
            self.health.wait_change(version, IDLE_WAIT_S)
