"""What the real server fills in on writes: API defaulting (every write) and create-time preparation.

Only the defaults of `k8s.io/kubernetes/pkg/apis/core/v1/defaults.go` and the registry strategies'
`PrepareForCreate`; admission plugins (service accounts, default tolerations, priority) are not run.
"""

from __future__ import annotations

from fractions import Fraction

from deviceplugin.fit.errors import QuantityError
from deviceplugin.fit.quantity import parse_quantity
from kubesim.apiserver.meta import Obj, meta, name_of

_QOS_RESOURCES = ("cpu", "memory")
_NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_NODE_INFO_FIELDS = (
    "machineID",
    "systemUUID",
    "bootID",
    "kernelVersion",
    "osImage",
    "containerRuntimeVersion",
    "kubeletVersion",
    "kubeProxyVersion",
    "operatingSystem",
    "architecture",
)


def _nothing(obj: Obj) -> None:
    """For kinds without defaults."""


NO_DEFAULTS = _nothing


def default_pod(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            _default_container(container)
    for key in ("initContainerStatuses", "containerStatuses"):
        for container_status in (pod.get("status") or {}).get(key) or []:
            # Fields Go always writes out, zero or not.
            for field, zero in (("ready", False), ("restartCount", 0), ("image", ""), ("imageID", "")):
                container_status.setdefault(field, zero)


def _default_container(container: Obj) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = str(container.get("image") or "")
    untagged = "@" not in image and ":" not in image.rsplit("/", 1)[-1]
    pull_always = untagged or image.endswith(":latest")
    container.setdefault("imagePullPolicy", "Always" if pull_always else "IfNotPresent")
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        # A limit without a request makes the request equal to the limit.
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)


def prepare_pod_create(pod: Obj) -> None:
    # The registry discards any status sent with a new pod.
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod)}


def qos_class(pod: Obj) -> str:
    """`BestEffort`, `Burstable` or `Guaranteed`, from the containers' cpu and memory requests and limits."""
    spec = pod.get("spec") or {}
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for section, totals in (("requests", requests), ("limits", limits)):
            for name, value in (resources.get(section) or {}).items():
                amount = _amount(value)
                if name in _QOS_RESOURCES and amount:
                    totals[name] = totals.get(name, Fraction(0)) + amount
        if not all(_amount((resources.get("limits") or {}).get(name)) for name in _QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


def _amount(value: object) -> Fraction:
    if value is None:
        return Fraction(0)
    try:
        return parse_quantity(value)
    except QuantityError:
        return Fraction(0)


def default_namespace(namespace: Obj) -> None:
    meta(namespace).setdefault("labels", {})[_NAMESPACE_NAME_LABEL] = name_of(namespace)


def prepare_namespace_create(namespace: Obj) -> None:
    namespace["spec"] = {"finalizers": ["kubernetes"]}
    namespace["status"] = {"phase": "Active"}


def default_node(node: Obj) -> None:
    status = node.setdefault("status", {})
    if status.get("capacity") and "allocatable" not in status:
        status["allocatable"] = dict(status["capacity"])
    # Go writes these structs out in full even when nothing set them; clients expect every key.
    status.setdefault("daemonEndpoints", {"kubeletEndpoint": {"Port": 0}})
    info = status.setdefault("nodeInfo", {})
    for key in _NODE_INFO_FIELDS:
        info.setdefault(key, "")
