"""Publishes what the scheduler needs to know about this node (annotations and extended resources in
node status) and keeps it there when someone else changes or removes it.

`NodeWatch` follows this one node (list + watch, field selector `metadata.name=<node>`). The
publisher compares the wanted state with the node on every watch event, GPU health change, kubelet
re-registration and every `resync_s` (upstream plugins re-publish on start and every 30 s). The
watch restores a foreign change within about a second; the periodic read from the API server is
the safety net for a watch that fails silently (a half-open connection only times out after the
watch's 300 s) and for whatever the watch cannot see while it is down. Writes stay change-only:
only the keys that differ are written, and a difference seen in the cache is confirmed with a read
first, because the cache may still show the node as it was before our own last write. Failures,
conflicts included, are retried with back-off and the node is read again before the next attempt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from deviceplugin.backoff import Backoff, Retries
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.api import ApiError, Kube, Obj
from deviceplugin.kube.podcache import ListWatchCache
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

# Between failed node writes: every daemon's publisher writes its own node, so a tight loop per
# node would keep a recovering API server down.
NODE_WRITE_RETRY = Backoff(start_s=0.2, max_s=10.0)
RESYNC_S = 30.0


@dataclass(frozen=True)
class NodeState:
    """Annotations (None: remove the key), labels and status resources (set in capacity and
    allocatable)."""

    annotations: Mapping[str, str | None] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def annotation_patch(self, node: Obj) -> dict[str, str | None]:
        current = node.get("metadata", {}).get("annotations") or {}
        return {k: v for k, v in self.annotations.items() if current.get(k) != v}

    def label_patch(self, node: Obj) -> dict[str, str]:
        current = node.get("metadata", {}).get("labels") or {}
        return {k: v for k, v in self.labels.items() if current.get(k) != v}

    def status_patch(self, node: Obj) -> dict[str, dict[str, str]]:
        status = node.get("status", {})
        stale = {
            section: {k: v for k, v in self.resources.items() if (status.get(section) or {}).get(k) != v}
            for section in ("capacity", "allocatable")
        }
        return {section: values for section, values in stale.items() if values}

    def differs(self, node: Obj) -> bool:
        return bool(self.annotation_patch(node) or self.label_patch(node) or self.status_patch(node))


def _name(node: Obj) -> str:
    return str(node.get("metadata", {}).get("name", ""))


class NodeWatch(ListWatchCache):
    """This node, kept current by list + watch of `metadata.name=<name>`."""

    def __init__(self, kube: Kube, name: str, supervisor: Supervisor | None = None) -> None:
        self.name = name
        selector = f"metadata.name={name}"
        super().__init__(
            "node",
            lambda: kube.list_nodes_versioned(selector),
            lambda version, timeout_s: kube.watch_nodes(selector, version, timeout_s),
            key=_name,
            scope=name,
            supervisor=supervisor,
        )

    def node(self) -> Obj | None:
        """The node as last seen, or None until the first list (or when it does not exist)."""
        return self.get(self.name)


class NodePublisher:
    def __init__(
        self,
        kube: Kube,
        watch: NodeWatch,
        wanted: Callable[[], NodeState],
        health: HealthState,
        resync_s: float = RESYNC_S,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.kube = kube
        self.watch = watch
        self.node_name = watch.name
        self.wanted = wanted
        self.health = health
        self.resync_s = resync_s
        self._published: NodeState | None = None
        self._cond = threading.Condition()
        self._kicked = False
        self._read_due = True  # the next check reads the node from the API server, not the cache
        self._checks = 0
        self._worker = Worker("node-publisher", self._run, interrupt=self.kick, supervisor=supervisor)
        watch.add_listener(lambda _kind, _node: self.kick())

    @property
    def published(self) -> bool:
        """The node held the state wanted at the last check."""
        return self._published is not None and self._published == self.wanted()

    @property
    def checks(self) -> int:
        """Completed comparisons of the node with the wanted state (successful or not)."""
        with self._cond:
            return self._checks

    def wait_checks(self, count: int, timeout_s: float) -> bool:
        """Block until `checks` reaches `count` or the timeout passes."""
        with self._cond:
            return self._cond.wait_for(lambda: self._checks >= count, timeout_s)

    def start(self) -> None:
        self.health.add_listener(self._on_health)
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()
        self.health.remove_listener(self._on_health)

    def kick(self) -> None:
        """Compare again now (the node or the wanted state may have changed)."""
        with self._cond:
            self._kicked = True
            self._cond.notify_all()

    def recheck(self) -> None:
        """Read the node from the API server and compare now: kubelet re-registered (a kubelet that
        restarts after a reboot resets extended resources such as `volcano.sh/gpu-number`)."""
        with self._cond:
            self._read_due = True
        self.kick()

    def _on_health(self, _uuid: str, _healthy: bool, _reason: str) -> None:
        self.kick()

    def check(self, read: bool) -> None:
        """Bring the node to the wanted state, writing only the keys that differ. With `read` false
        an open watch's cache is trusted when it shows nothing to do."""
        state = self.wanted()
        cached = self.watch.node() if self.watch.synced and not read else None
        if cached is None or state.differs(cached):
            self.publish(state, self.kube.get_node(self.node_name))
        self._published = state

    def publish(self, state: NodeState, node: Obj) -> None:
        """Write to the node whatever of `state` it does not hold."""
        # Keys this daemon had published that are now wrong were changed by someone else.
        foreign = self._published == state
        annotations, labels = state.annotation_patch(node), state.label_patch(node)
        if foreign:
            metadata = node.get("metadata", {})
            for kind, changes in (("annotations", annotations), ("labels", labels)):
                if changes:
                    current = metadata.get(kind) or {}
                    log.warning(
                        f"node {kind} changed by someone else, restoring",
                        node=self.node_name,
                        **{k: current.get(k, "(absent)") for k in changes},
                    )
        if annotations or labels:
            written = {"annotations": annotations, "labels": labels}
            self.kube.patch_node(self.node_name, {"metadata": {k: v for k, v in written.items() if v}})
            log.info(
                "node metadata written",
                node=self.node_name,
                **{k: v or "(removed)" for k, v in {**annotations, **labels}.items()},
            )
        status = state.status_patch(node)
        if status:
            if foreign:
                log.warning("node resources changed by someone else, restoring", node=self.node_name)
            self.kube.patch_node_status(self.node_name, {"status": status})
            log.info("node status written", node=self.node_name, resources=dict(state.resources))

    def _take(self) -> bool:
        """Consume a pending kick; returns whether the next check must read from the API server."""
        with self._cond:
            self._kicked = False
            read, self._read_due = self._read_due, False
            return read

    def _counted(self) -> None:
        with self._cond:
            self._checks += 1
            self._cond.notify_all()

    def _run(self) -> None:
        retries = Retries(NODE_WRITE_RETRY)
        next_read = time.monotonic()
        while not self._worker.stopping.is_set():
            read = self._take() or time.monotonic() >= next_read
            try:
                self.check(read)
            except ApiError as err:
                self._published = None
                self._counted()
                delay = retries.failed()
                log.warning("node update failed", node=self.node_name, error=str(err), retry_s=delay)
                with self._cond:
                    self._read_due = True
                self._worker.stopping.wait(delay)
                continue
            retries.succeeded()
            if read:
                next_read = time.monotonic() + self.resync_s
            self._counted()
            self._worker.turn()
            with self._cond:
                self._cond.wait_for(
                    lambda: self._kicked or self._worker.stopping.is_set(),
                    max(0.0, next_read - time.monotonic()),
                )
