"""Server-side printing: the columns `kubectl get` shows, computed the way the real server computes them.

The server always fills every column; priority-1 columns are the ones kubectl adds for `-o wide`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubesim.apiserver.meta import Obj, dig, labels_of, name_of, parse_time, text_at

_NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
_LEGACY_ROLE_LABEL = "kubernetes.io/role"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    description: str
    priority: int = 0
    format: str = ""

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class Printer:
    columns: tuple[Column, ...]
    cells: Callable[[Obj, float], list[Any]]  # (object, now) -> one cell per column
    conditions: Callable[[Obj], list[Obj]] = lambda obj: []


_NAME = Column("Name", "string", "Name of the object, unique within its namespace.", format="name")
_AGE = Column("Age", "string", "Time since the object was created.")


def human_duration(seconds: float) -> str:
    """apimachinery's `duration.HumanDuration`: "45s", "3m20s", "5h10m", "12d"."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y{rest}d" if rest else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _since(timestamp: object, now: float) -> str:
    seconds = parse_time(timestamp)
    return "<unknown>" if seconds is None else human_duration(now - seconds)


def _age(obj: Obj, now: float) -> str:
    return _since(dig(obj, "metadata", "creationTimestamp"), now)


# --------------------------------------------------------------------------- pods


def _pod_cells(pod: Obj, now: float) -> list[Any]:
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    reason = status.get("reason") or status.get("phase") or ""
    if any(
        c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in _conditions(pod)
    ):
        reason = "SchedulingGated"
    sidecars = {c.get("name") for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    total = len(spec.get("containers") or []) + len(sidecars)
    ready = 0
    restarts = 0
    last_restart = 0.0

    def count_restarts(container: Obj) -> None:
        nonlocal restarts, last_restart
        restarts += int(container.get("restartCount") or 0)
        finished = parse_time(dig(container, "lastState", "terminated", "finishedAt"))
        last_restart = max(last_restart, finished or 0.0)

    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for index, container in enumerate(init_statuses):
        count_restarts(container)
        state = container.get("state") or {}
        terminated = state.get("terminated")
        waiting_reason = dig(state, "waiting", "reason")
        if terminated is not None and terminated.get("exitCode", 0) == 0:
            continue
        if container.get("name") in sidecars and container.get("started"):
            ready += 1 if container.get("ready") else 0
            continue
        if terminated is not None:
            reason = "Init:" + (terminated.get("reason") or _exit_text(terminated))
        elif waiting_reason and waiting_reason != "PodInitializing":
            reason = "Init:" + waiting_reason
        else:
            reason = f"Init:{index}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break
    initialized = any(c.get("type") == "Initialized" and c.get("status") == "True" for c in _conditions(pod))
    if not initializing or initialized:
        running = False
        for container in reversed(status.get("containerStatuses") or []):
            count_restarts(container)
            state = container.get("state") or {}
            terminated = state.get("terminated")
            if dig(state, "waiting", "reason"):
                reason = state["waiting"]["reason"]
            elif terminated is not None:
                reason = terminated.get("reason") or _exit_text(terminated)
            elif container.get("ready") and state.get("running") is not None:
                running = True
                ready += 1
        if reason == "Completed" and running:
            pod_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in _conditions(pod))
            reason = "Running" if pod_ready else "NotReady"
    deleting = dig(pod, "metadata", "deletionTimestamp") is not None
    if deleting and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif deleting and status.get("phase") not in ("Succeeded", "Failed"):
        reason = "Terminating"
    shown_restarts = str(restarts)
    if restarts and last_restart:
        shown_restarts = f"{restarts} ({human_duration(now - last_restart)} ago)"
    pod_ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    gates_text = "<none>"
    if gates:
        true_conditions = {c.get("type") for c in _conditions(pod) if c.get("status") == "True"}
        gates_text = f"{sum(1 for g in gates if g.get('conditionType') in true_conditions)}/{len(gates)}"
    return [
        name_of(pod),
        f"{ready}/{total}",
        reason,
        shown_restarts,
        _age(pod, now),
        (pod_ips[0].get("ip") if pod_ips else "") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gates_text,
    ]


def _conditions(obj: Obj) -> list[Obj]:
    return dig(obj, "status", "conditions") or []


def _exit_text(terminated: Obj) -> str:
    signal = terminated.get("signal") or 0
    return f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"


def _pod_row_conditions(pod: Obj) -> list[Obj]:
    # Rows of finished pods carry this condition so clients can tell them apart.
    if dig(pod, "status", "phase") in ("Succeeded", "Failed"):
        return [{"type": "Completed", "status": "True"}]
    return []


PODS = Printer(
    (
        _NAME,
        Column("Ready", "string", "Containers ready out of all containers."),
        Column("Status", "string", "Summary of the pod's and its containers' state."),
        Column("Restarts", "string", "Container restarts, and how long ago the last one was."),
        _AGE,
        Column("IP", "string", "The pod's first IP address.", priority=1),
        Column("Node", "string", "The node the pod is bound to.", priority=1),
        Column("Nominated Node", "string", "The node preemption nominated for the pod.", priority=1),
        Column("Readiness Gates", "string", "Readiness gates met out of all gates.", priority=1),
    ),
    _pod_cells,
    _pod_row_conditions,
)


# --------------------------------------------------------------------------- nodes


def _node_cells(node: Obj, now: float) -> list[Any]:
    ready = [c for c in _conditions(node) if c.get("type") == "Ready"]
    states = [("Ready" if ready[-1].get("status") == "True" else "NotReady")] if ready else ["Unknown"]
    if dig(node, "spec", "unschedulable"):
        states.append("SchedulingDisabled")
    roles = set()
    for key, value in labels_of(node).items():
        if key.startswith(_NODE_ROLE_PREFIX) and key[len(_NODE_ROLE_PREFIX) :]:
            roles.add(key[len(_NODE_ROLE_PREFIX) :])
        elif key == _LEGACY_ROLE_LABEL and value:
            roles.add(value)

    def address(kind: str) -> str:
        found = [a.get("address") for a in dig(node, "status", "addresses") or [] if a.get("type") == kind]
        return found[0] if found else "<none>"

    def info(field: str) -> str:
        return text_at(node, "status", "nodeInfo", field) or "<unknown>"

    return [
        name_of(node),
        ",".join(states),
        ",".join(sorted(roles)) or "<none>",
        _age(node, now),
        text_at(node, "status", "nodeInfo", "kubeletVersion"),
        address("InternalIP"),
        address("ExternalIP"),
        info("osImage"),
        info("kernelVersion"),
        info("containerRuntimeVersion"),
    ]


NODES = Printer(
    (
        _NAME,
        Column("Status", "string", "Readiness of the node, and whether it takes new pods."),
        Column("Roles", "string", "Roles from the node-role labels."),
        _AGE,
        Column("Version", "string", "Kubelet version."),
        Column("Internal-IP", "string", "First internal address.", priority=1),
        Column("External-IP", "string", "First external address.", priority=1),
        Column("OS-Image", "string", "Operating system image.", priority=1),
        Column("Kernel-Version", "string", "Kernel version.", priority=1),
        Column("Container-Runtime", "string", "Container runtime and version.", priority=1),
    ),
    _node_cells,
)


# --------------------------------------------------------------------------- namespaces, configmaps


NAMESPACES = Printer(
    (_NAME, Column("Status", "string", "Phase of the namespace."), _AGE),
    lambda ns, now: [name_of(ns), text_at(ns, "status", "phase"), _age(ns, now)],
)

CONFIGMAPS = Printer(
    (_NAME, Column("Data", "string", "Number of data and binary data entries."), _AGE),
    lambda cm, now: [name_of(cm), len(cm.get("data") or {}) + len(cm.get("binaryData") or {}), _age(cm, now)],
)


# --------------------------------------------------------------------------- events


def _event_cells(event: Obj, now: float) -> list[Any]:
    first = _since(event.get("firstTimestamp") or event.get("eventTime"), now)
    last = _since(event.get("lastTimestamp"), now) if event.get("lastTimestamp") else first
    count = event.get("count") or 1
    series = event.get("series")
    if isinstance(series, dict):
        last = _since(series.get("lastObservedTime"), now)
        count = series.get("count") or count
    involved = event.get("involvedObject") or {}
    target = str(involved.get("kind") or "").lower()
    if involved.get("name"):
        target = f"{target}/{involved['name']}"
    source = event.get("source") or {}
    component, host = source.get("component") or "", source.get("host") or ""
    if not component:
        component, host = event.get("reportingComponent") or "", event.get("reportingInstance") or ""
    return [
        last,
        event.get("type") or "",
        event.get("reason") or "",
        target,
        involved.get("fieldPath") or "",
        f"{component}, {host}" if host else component,
        str(event.get("message") or "").strip(),
        first,
        int(count),
        name_of(event),
    ]


EVENTS = Printer(
    (
        Column("Last Seen", "string", "Time since the event was last seen."),
        Column("Type", "string", "Normal or Warning."),
        Column("Reason", "string", "Why the event happened, in one word."),
        Column("Object", "string", "The object the event is about."),
        Column("Subobject", "string", "The part of the object the event is about.", priority=1),
        Column("Source", "string", "The component that reported the event.", priority=1),
        Column("Message", "string", "What happened."),
        Column("First Seen", "string", "Time since the event was first seen.", priority=1),
        Column("Count", "string", "How many times the event happened.", priority=1),
        Column("Name", "string", "Name of the event object.", priority=1),
    ),
    _event_cells,
)


# --------------------------------------------------------------------------- leases


LEASES = Printer(
    (_NAME, Column("Holder", "string", "The lease's holder."), _AGE),
    lambda lease, now: [name_of(lease), text_at(lease, "spec", "holderIdentity"), _age(lease, now)],
)


# --------------------------------------------------------------------------- pod groups

#: Volcano's PodGroup CRD columns (its additionalPrinterColumns).
PODGROUPS = Printer(
    (
        _NAME,
        Column("STATUS", "string", "The pod group's phase."),
        Column("minMember", "integer", "Pods that must be placed together."),
        Column("RUNNINGS", "integer", "Pods running."),
        _AGE,
        Column("QUEUE", "string", "The queue it is in.", priority=1),
    ),
    lambda group, now: [
        name_of(group),
        text_at(group, "status", "phase"),
        (group.get("spec") or {}).get("minMember"),
        (group.get("status") or {}).get("running"),
        _age(group, now),
        text_at(group, "spec", "queue"),
    ],
)


# --------------------------------------------------------------------------- admission policies


VALIDATING_ADMISSION_POLICIES = Printer(
    (
        _NAME,
        Column("Validations", "integer", "Number of validations."),
        Column("ParamKind", "string", "The kind of the policy's parameters."),
        _AGE,
    ),
    lambda policy, now: [
        name_of(policy),
        len(policy.get("spec", {}).get("validations") or []),
        _param_kind(policy),
        _age(policy, now),
    ],
)


def _param_kind(policy: Obj) -> str:
    kind = policy.get("spec", {}).get("paramKind") or {}
    return f"{kind.get('apiVersion')}/{kind.get('kind')}" if kind else "<unset>"


def _param_ref(binding: Obj) -> str:
    ref = binding.get("spec", {}).get("paramRef") or {}
    return f"{ref.get('namespace') or '*'}/{ref.get('name') or '*'}" if ref else "<unset>"


VALIDATING_ADMISSION_POLICY_BINDINGS = Printer(
    (
        _NAME,
        Column("PolicyName", "string", "The policy it binds."),
        Column("ParamRef", "string", "The parameters it binds the policy to."),
        _AGE,
    ),
    lambda binding, now: [
        name_of(binding),
        text_at(binding, "spec", "policyName"),
        _param_ref(binding),
        _age(binding, now),
    ],
)
