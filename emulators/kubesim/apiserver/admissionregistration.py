"""admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding:
the defaults and the structural validation the real server applies when they are written.

The emulator stores the policies; it does not compile or enforce their CEL (tests/deploy evaluates
the shipped ones). What is checked is what `kubectl apply` runs into on a real server without a
CEL compiler: required fields, the enumerations, names of variables and match conditions, one-line
messages, and a binding's validation actions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from kubesim.apiserver.errors import FieldCause
from kubesim.apiserver.meta import Obj

OPERATIONS = ("*", "CREATE", "UPDATE", "DELETE", "CONNECT")
FAILURE_POLICIES = ("Fail", "Ignore")
REASONS = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")
ACTIONS = ("Deny", "Warn", "Audit")
_CEL_IDENTIFIER = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")
# A qualified name (match condition names): an optional DNS-subdomain prefix and a name part.
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _required(field: str, detail: str = "") -> FieldCause:
    return FieldCause(
        "FieldValueRequired", field, f"Required value: {detail}" if detail else "Required value"
    )


def _unsupported(field: str, value: object, supported: Iterable[str]) -> FieldCause:
    listed = ", ".join(f'"{choice}"' for choice in supported)
    return FieldCause(
        "FieldValueNotSupported", field, f'Unsupported value: "{value}": supported values: {listed}'
    )


def _invalid(field: str, value: object, detail: str) -> FieldCause:
    return FieldCause("FieldValueInvalid", field, f'Invalid value: "{value}": {detail}')


def _list(obj: Obj, key: str) -> list[Any]:
    found = obj.get(key)
    return found if isinstance(found, list) else []


def default_policy(policy: Obj) -> None:
    spec = policy.setdefault("spec", {})
    spec.setdefault("failurePolicy", "Fail")
    constraints = spec.get("matchConstraints")
    if isinstance(constraints, dict):
        constraints.setdefault("matchPolicy", "Equivalent")
        constraints.setdefault("namespaceSelector", {})
        constraints.setdefault("objectSelector", {})
        for rule in _list(constraints, "resourceRules"):
            rule.setdefault("scope", "*")


def default_binding(binding: Obj) -> None:
    spec = binding.setdefault("spec", {})
    resources = spec.get("matchResources")
    if isinstance(resources, dict):
        resources.setdefault("matchPolicy", "Equivalent")
        resources.setdefault("namespaceSelector", {})
        resources.setdefault("objectSelector", {})


def validate_policy(policy: Obj) -> list[FieldCause]:
    spec = policy.get("spec") or {}
    causes = _constraints(spec.get("matchConstraints"))
    if spec.get("failurePolicy") not in FAILURE_POLICIES:
        causes.append(_unsupported("spec.failurePolicy", spec.get("failurePolicy"), FAILURE_POLICIES))
    if not _list(spec, "validations") and not _list(spec, "auditAnnotations"):
        causes.append(
            _required("spec.validations", "validations or auditAnnotations must contain at least one item")
        )
    for index, validation in enumerate(_list(spec, "validations")):
        where = f"spec.validations[{index}]"
        if not str(validation.get("expression") or "").strip():
            causes.append(_required(f"{where}.expression"))
        message = validation.get("message")
        if isinstance(message, str) and ("\n" in message or "\r" in message):
            causes.append(_invalid(f"{where}.message", message, "message must not contain line breaks"))
        reason = validation.get("reason")
        if reason is not None and reason not in REASONS:
            causes.append(_unsupported(f"{where}.reason", reason, REASONS))
    causes += _named_expressions(spec, "matchConditions", _qualified_name_problem)
    causes += _named_expressions(spec, "variables", _variable_name_problem)
    return causes


def _constraints(constraints: object) -> list[FieldCause]:
    if not isinstance(constraints, dict):
        return [_required("spec.matchConstraints")]
    rules = _list(constraints, "resourceRules")
    if not rules:
        return [_required("spec.matchConstraints.resourceRules")]
    causes = []
    for index, rule in enumerate(rules):
        where = f"spec.matchConstraints.resourceRules[{index}]"
        for key in ("operations", "apiGroups", "apiVersions", "resources"):
            if not _list(rule, key):
                causes.append(_required(f"{where}.{key}"))
        for op_index, operation in enumerate(_list(rule, "operations")):
            if operation not in OPERATIONS:
                causes.append(_unsupported(f"{where}.operations[{op_index}]", operation, OPERATIONS))
    return causes


def _named_expressions(spec: Obj, key: str, name_problem: Callable[[str], str]) -> list[FieldCause]:
    causes = []
    seen: set[str] = set()
    for index, item in enumerate(_list(spec, key)):
        where = f"spec.{key}[{index}]"
        name = str(item.get("name") or "")
        if not name:
            causes.append(_required(f"{where}.name"))
        elif problem := name_problem(name):
            causes.append(_invalid(f"{where}.name", name, problem))
        elif name in seen:
            causes.append(FieldCause("FieldValueDuplicate", f"{where}.name", f'Duplicate value: "{name}"'))
        seen.add(name)
        if not str(item.get("expression") or "").strip():
            causes.append(_required(f"{where}.expression"))
    return causes


def _qualified_name_problem(name: str) -> str:
    prefix, _, part = name.rpartition("/")
    if (prefix and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", prefix)) or len(part) > 63:
        return (
            "must be a qualified name (an optional DNS subdomain prefix and '/', then at most 63 characters)"
        )
    if not _NAME_PART.fullmatch(part):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character"
        )
    return ""


def _variable_name_problem(name: str) -> str:
    return "" if _CEL_IDENTIFIER.fullmatch(name) else "name is not a valid CEL identifier"


def validate_binding(binding: Obj) -> list[FieldCause]:
    spec = binding.get("spec") or {}
    causes = []
    if not spec.get("policyName"):
        causes.append(_required("spec.policyName"))
    actions = _list(spec, "validationActions")
    if not actions:
        causes.append(_required("spec.validationActions"))
    for index, action in enumerate(actions):
        where = f"spec.validationActions[{index}]"
        if action not in ACTIONS:
            causes.append(_unsupported(where, action, ACTIONS))
        elif action in actions[:index]:
            causes.append(FieldCause("FieldValueDuplicate", where, f'Duplicate value: "{action}"'))
    if "Deny" in actions and "Warn" in actions:
        causes.append(
            FieldCause(
                "FieldValueInvalid",
                "spec.validationActions",
                "Invalid value: must not contain both Deny and Warn (repeating the same validation failure "
                "information in the API response and headers serves no purpose)",
            )
        )
    return causes
