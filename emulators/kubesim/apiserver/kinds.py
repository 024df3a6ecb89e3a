"""The kinds the emulator serves, one table entry each: adding a kind is adding an entry here.

Everything per kind that the real server takes from its registry strategy lives in the entry:
selectable fields, strategic-merge list keys, defaults, validation, printer columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kubesim.apiserver import admissionregistration, defaults, printers, validation
from kubesim.apiserver.defaults import NO_DEFAULTS
from kubesim.apiserver.errors import FieldCause
from kubesim.apiserver.mergepatch import MergeKeys
from kubesim.apiserver.meta import Obj, dig, text_at
from kubesim.apiserver.selectors import FieldGetter

API_VERSION = "v1"  # the core group's
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _at(*path: str) -> FieldGetter:
    return lambda obj: text_at(obj, *path)


def _first_pod_ip(pod: Mapping[str, object]) -> str:
    ips = dig(pod, "status", "podIPs") or []
    return str(ips[0].get("ip") or "") if ips else ""


_NAME_FIELD = {"metadata.name": _at("metadata", "name")}
_NAMESPACED_FIELDS = {**_NAME_FIELD, "metadata.namespace": _at("metadata", "namespace")}

# Strategic-merge list keys from the `patchStrategy:"merge"` tags of k8s.io/api/core/v1.
_METADATA_KEYS = {"metadata.finalizers": "", "metadata.ownerReferences": "uid"}
_CONTAINER_KEYS = {
    "ports": "containerPort",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}
_POD_KEYS = {
    **_METADATA_KEYS,
    "spec.volumes": "name",
    "spec.imagePullSecrets": "name",
    "spec.hostAliases": "ip",
    "spec.schedulingGates": "name",
    "spec.resourceClaims": "name",
    **{f"spec.{group}": "name" for group in ("initContainers", "containers", "ephemeralContainers")},
    **{
        f"spec.{group}.{key}": merge_key
        for group in ("initContainers", "containers", "ephemeralContainers")
        for key, merge_key in _CONTAINER_KEYS.items()
    },
    "status.conditions": "type",
    "status.podIPs": "ip",
    "status.hostIPs": "ip",
}


def _no_causes(obj: Obj) -> list[FieldCause]:
    return []


def _no_update_causes(new: Obj, old: Obj) -> list[FieldCause]:
    return []


@dataclass(frozen=True)
class Kind:
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...]
    printer: printers.Printer
    fields: Mapping[str, FieldGetter]
    merge_keys: MergeKeys = field(default_factory=lambda: dict(_METADATA_KEYS))
    subresources: tuple[str, ...] = ()
    #: Runs on every write, like the defaulting of a decoded object.
    defaults: Callable[[Obj], None] = NO_DEFAULTS
    prepare_create: Callable[[Obj], None] = NO_DEFAULTS
    validate: Callable[[Obj], list[FieldCause]] = _no_causes
    validate_update: Callable[[Obj, Obj], list[FieldCause]] = _no_update_causes
    #: Namespaces' names are DNS labels; everything else here takes a DNS subdomain.
    label_names: bool = False
    #: PUT of a missing object creates it (events allow it; most kinds answer 404).
    create_on_update: bool = False
    #: DELETE answers with the object (pods, namespaces) rather than a success Status.
    returns_deleted: bool = False
    categories: tuple[str, ...] = ()
    #: The API group ("" for core, served under /api) and version.
    group: str = ""
    version: str = API_VERSION

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """The URL path its group version is served under."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


PODS = Kind(
    plural="pods",
    singular="pod",
    kind="Pod",
    namespaced=True,
    short_names=("po",),
    printer=printers.PODS,
    fields={
        **_NAMESPACED_FIELDS,
        "spec.nodeName": _at("spec", "nodeName"),
        "spec.restartPolicy": _at("spec", "restartPolicy"),
        "spec.schedulerName": _at("spec", "schedulerName"),
        "spec.serviceAccountName": _at("spec", "serviceAccountName"),
        "spec.hostNetwork": lambda pod: text_at(pod, "spec", "hostNetwork") or "false",
        "status.phase": _at("status", "phase"),
        "status.podIP": _first_pod_ip,
        "status.nominatedNodeName": _at("status", "nominatedNodeName"),
    },
    merge_keys=_POD_KEYS,
    subresources=("status", "binding"),
    defaults=defaults.default_pod,
    prepare_create=defaults.prepare_pod_create,
    validate=validation.validate_pod,
    validate_update=validation.validate_pod_update,
    returns_deleted=True,
    categories=("all",),
)

NODES = Kind(
    plural="nodes",
    singular="node",
    kind="Node",
    namespaced=False,
    short_names=("no",),
    printer=printers.NODES,
    fields={
        **_NAME_FIELD,
        "spec.unschedulable": lambda node: text_at(node, "spec", "unschedulable") or "false",
    },
    merge_keys={
        **_METADATA_KEYS,
        "spec.podCIDRs": "",
        "status.conditions": "type",
        "status.addresses": "type",
    },
    subresources=("status",),
    defaults=defaults.default_node,
)

NAMESPACES = Kind(
    plural="namespaces",
    singular="namespace",
    kind="Namespace",
    namespaced=False,
    short_names=("ns",),
    printer=printers.NAMESPACES,
    fields={**_NAME_FIELD, "status.phase": _at("status", "phase")},
    merge_keys={**_METADATA_KEYS, "status.conditions": "type"},
    subresources=("status",),
    defaults=defaults.default_namespace,
    prepare_create=defaults.prepare_namespace_create,
    label_names=True,
    returns_deleted=True,
)

EVENTS = Kind(
    plural="events",
    singular="event",
    kind="Event",
    namespaced=True,
    short_names=("ev",),
    printer=printers.EVENTS,
    fields={
        **_NAMESPACED_FIELDS,
        **{
            f"involvedObject.{key}": _at("involvedObject", key)
            for key in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
        "reason": _at("reason"),
        "reportingComponent": _at("reportingComponent"),
        "source": _at("source", "component"),
        "type": _at("type"),
    },
    create_on_update=True,
)

CONFIGMAPS = Kind(
    plural="configmaps",
    singular="configmap",
    kind="ConfigMap",
    namespaced=True,
    short_names=("cm",),
    printer=printers.CONFIGMAPS,
    fields=_NAMESPACED_FIELDS,
)

#: Kubelet's node heartbeat (kube-node-lease/<node>), which `kubectl describe node` shows.
LEASES = Kind(
    plural="leases",
    singular="lease",
    kind="Lease",
    namespaced=True,
    short_names=(),
    printer=printers.LEASES,
    fields=_NAMESPACED_FIELDS,
    group="coordination.k8s.io",
)

#: Volcano's pod groups, as the simulated cluster's Volcano Jobs make them (stored, not acted on).
PODGROUPS = Kind(
    plural="podgroups",
    singular="podgroup",
    kind="PodGroup",
    namespaced=True,
    short_names=("pg", "podgroup-v1beta1"),
    printer=printers.PODGROUPS,
    fields=_NAMESPACED_FIELDS,
    subresources=("status",),
    group="scheduling.volcano.sh",
    version="v1beta1",
)

#: The admission policies of deploy/admission-policy.yaml: stored and validated, not enforced.
VALIDATING_ADMISSION_POLICIES = Kind(
    plural="validatingadmissionpolicies",
    singular="validatingadmissionpolicy",
    kind="ValidatingAdmissionPolicy",
    namespaced=False,
    short_names=(),
    printer=printers.VALIDATING_ADMISSION_POLICIES,
    fields=_NAME_FIELD,
    subresources=("status",),
    defaults=admissionregistration.default_policy,
    validate=admissionregistration.validate_policy,
    categories=("api-extensions",),
    group="admissionregistration.k8s.io",
)

VALIDATING_ADMISSION_POLICY_BINDINGS = Kind(
    plural="validatingadmissionpolicybindings",
    singular="validatingadmissionpolicybinding",
    kind="ValidatingAdmissionPolicyBinding",
    namespaced=False,
    short_names=(),
    printer=printers.VALIDATING_ADMISSION_POLICY_BINDINGS,
    fields=_NAME_FIELD,
    defaults=admissionregistration.default_binding,
    validate=admissionregistration.validate_binding,
    categories=("api-extensions",),
    group="admissionregistration.k8s.io",
)

KINDS: tuple[Kind, ...] = (
    NAMESPACES,
    PODS,
    NODES,
    EVENTS,
    CONFIGMAPS,
    LEASES,
    PODGROUPS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
BY_PLURAL: Mapping[str, Kind] = {kind.plural: kind for kind in KINDS}
#: Group versions in the order discovery lists them, the core one first.
GROUP_VERSIONS: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys((kind.group, kind.version) for kind in KINDS)
)
