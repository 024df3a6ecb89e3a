"""Kubernetes Events the user must see, posted in the background so no caller waits on the API."""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deviceplugin.kube.api import ApiError, Kube, Obj, retry
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

COMPONENT = "volcano-gpu-device-plugin"
QUEUE_LIMIT = 1000
POST_DEADLINE_S = 30.0


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an event is about."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def pod(cls, pod: Mapping[str, Any]) -> Involved:
        meta = pod.get("metadata", {})
        return cls("Pod", meta.get("name", ""), meta.get("namespace") or "default", meta.get("uid", ""))

    @classmethod
    def node(cls, name: str, uid: str = "") -> Involved:
        return cls("Node", name, "", uid)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def event_body(about: Involved, event_type: str, reason: str, message: str, host: str) -> Obj:
    """A core/v1 Event. Node events live in `default`, as kubelet's own node events do."""
    namespace = about.namespace or "default"
    stamp = _now()
    involved = {"kind": about.kind, "name": about.name, "apiVersion": "v1"}
    if about.namespace:
        involved["namespace"] = about.namespace
    if about.uid:
        involved["uid"] = about.uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about.name}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    """Queues events and posts them from one thread, retrying transient API failures. When the
    queue is full (a long outage) new events are dropped with a log line rather than blocking."""

    def __init__(self, kube: Kube, host: str, supervisor: Supervisor | None = None) -> None:
        self.kube = kube
        self.host = host
        self._queue: queue.Queue[Obj | None] = queue.Queue(QUEUE_LIMIT)
        self._worker = Worker(
            "events", self._run, interrupt=lambda: self._queue.put(None), supervisor=supervisor
        )

    def record(self, about: Involved, event_type: str, reason: str, message: str) -> None:
        body = event_body(about, event_type, reason, message, self.host)
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.warning("event dropped: queue full", reason=reason, object=about.name)

    def warning(self, about: Involved, reason: str, message: str) -> None:
        self.record(about, "Warning", reason, message)

    def normal(self, about: Involved, reason: str, message: str) -> None:
        self.record(about, "Normal", reason, message)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        """Post what is queued (each within its own deadline), then stop."""
        self._worker.stop()

    def _post(self, body: Obj) -> None:
        namespace = body["metadata"]["namespace"]
        try:
            retry(lambda: self.kube.create_event(namespace, body), "create event", deadline_s=POST_DEADLINE_S)
        except ApiError as err:
            log.warning("event not posted", reason=body["reason"], error=str(err))

    def _run(self) -> None:
        while True:
            self._worker.turn()  # ready for the next: a crash costs the event being posted, not more
            body = self._queue.get()
            if body is None:
                return
            self._post(body)
