"""Validation the real server applies and clients run into: names, a pod's containers, pod updates."""

from __future__ import annotations

import copy
import re

from kubesim.apiserver.errors import FieldCause
from kubesim.apiserver.meta import Obj, dig, name_of

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
# Messages from k8s.io/apimachinery/pkg/util/validation, which clients and people match on.
_SUBDOMAIN_HELP = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{_SUBDOMAIN}')"
)
_LABEL_HELP = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    f"validation is '{_LABEL}')"
)
_POD_UPDATE_FORBIDDEN = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


def _invalid(field: str, value: str, detail: str) -> FieldCause:
    return FieldCause("FieldValueInvalid", field, f'Invalid value: "{value}": {detail}')


def _required(field: str) -> FieldCause:
    return FieldCause("FieldValueRequired", field, "Required value")


def validate_name(obj: Obj, label_only: bool) -> list[FieldCause]:
    """`metadata.name` must be a DNS-1123 subdomain (a DNS-1123 label for namespaces)."""
    name = name_of(obj)
    if not name:
        return [
            FieldCause(
                "FieldValueRequired", "metadata.name", "Required value: name or generateName is required"
            )
        ]
    if label_only and (len(name) > 63 or not re.fullmatch(_LABEL, name)):
        return [_invalid("metadata.name", name, _LABEL_HELP)]
    if len(name) > 253 or not re.fullmatch(_SUBDOMAIN, name):
        return [_invalid("metadata.name", name, _SUBDOMAIN_HELP)]
    return []


def validate_pod(pod: Obj) -> list[FieldCause]:
    causes: list[FieldCause] = []
    containers = dig(pod, "spec", "containers")
    if not containers:
        causes.append(_required("spec.containers"))
    for key in ("initContainers", "containers"):
        for index, container in enumerate(dig(pod, "spec", key) or []):
            where = f"spec.{key}[{index}]"
            name = container.get("name") or ""
            if not name:
                causes.append(_required(f"{where}.name"))
            elif len(name) > 63 or not re.fullmatch(_LABEL, name):
                causes.append(_invalid(f"{where}.name", name, _LABEL_HELP))
            if not container.get("image"):
                causes.append(_required(f"{where}.image"))
    return causes


def validate_pod_update(new: Obj, old: Obj) -> list[FieldCause]:
    """A pod's spec is immutable but for images, deadlines, added tolerations and removed gates."""
    if _mutable_parts_removed(new, old) == _mutable_parts_removed(old, old):
        return []
    return [FieldCause("FieldValueForbidden", "spec", _POD_UPDATE_FORBIDDEN)]


def _mutable_parts_removed(pod: Obj, old: Obj) -> Obj:
    spec = copy.deepcopy(pod.get("spec") or {})
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            container.pop("image", None)
    spec.pop("activeDeadlineSeconds", None)
    spec.pop("terminationGracePeriodSeconds", None)
    old_tolerations = dig(old, "spec", "tolerations") or []
    tolerations = spec.pop("tolerations", None) or []
    if any(toleration not in tolerations for toleration in old_tolerations):
        spec["tolerations"] = tolerations  # removing a toleration is a change the check must see
    old_gates = dig(old, "spec", "schedulingGates") or []
    gates = spec.pop("schedulingGates", None) or []
    if any(gate not in old_gates for gate in gates):
        spec["schedulingGates"] = gates  # gates may only be removed
    return spec
