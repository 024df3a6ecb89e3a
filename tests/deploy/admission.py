"""ValidatingAdmissionPolicies of deploy/admission-policy.yaml, evaluated the way the API server does.

The CEL runs in cel-expr-python, the CEL project's own Python runtime (the C++ implementation of the
same language spec as the API server's cel-go), with the optional-types and strings extensions the
API server's environment has from Kubernetes 1.28 and 1.29. As in the API server, `object` and
`oldObject` are the objects as JSON maps (null where the operation has none) and `request` is the
AdmissionRequest as JSON with its empty fields left out (`subResource` is absent for a main
resource, `userInfo.extra` for a user without extras). The steps are the API server's: the
policy applies when a resource rule matches the operation and resource and every match condition
holds; variables are read lazily (one that fails costs only the expressions that read it); a
validation that is false denies with its message, one that fails to evaluate denies as well
(`failurePolicy: Fail`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cel_expr_python import cel  # type: ignore[import-untyped]  # ships no type information for mypy
from cel_expr_python.ext import ext_optional, ext_strings  # type: ignore[import-untyped]

from kubesim.apiserver import ApiServerEmulator
from kubesim.apiserver.kinds import BY_PLURAL
from kubesim.apiserver.watch import Change
from tests.deploy.manifests import ADMISSION_POLICY, Doc, documents, find

POLICY_FILE = ADMISSION_POLICY
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
DAEMON_USER = "system:serviceaccount:volcano-gpu:volcano-gpu-deviceplugin"
EXTENDER_USER = "system:serviceaccount:volcano-gpu:volcano-gpu-extender"

_ENV = cel.NewEnv(
    variables=dict.fromkeys(("object", "oldObject", "request", "variables"), cel.Type.DYN),
    extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
)


@dataclass(frozen=True)
class Request:
    """What an admission request carries: who, which operation on which resource, the objects."""

    user: str
    operation: str  # CREATE, UPDATE
    resource: str  # plural: nodes, pods, events
    obj: Doc
    old: Doc | None = None
    subresource: str = ""
    extra: Mapping[str, list[str]] = field(default_factory=dict)

    def as_cel(self) -> Doc:
        meta = self.obj.get("metadata") or {}
        request: Doc = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": str(self.obj.get("kind") or "")},
            "resource": {"group": "", "version": "v1", "resource": self.resource},
            "operation": self.operation,
            "userInfo": {"username": self.user, "groups": ["system:serviceaccounts", "system:authenticated"]},
            "name": str(meta.get("name") or ""),
        }
        for key, value in (("subResource", self.subresource), ("namespace", meta.get("namespace"))):
            if value:
                request[key] = value
        if self.extra:
            request["userInfo"]["extra"] = {key: list(values) for key, values in self.extra.items()}
        return request


def pod_token_extra(node: str) -> dict[str, list[str]]:
    """The user extras of a ServiceAccount token mounted in a pod on `node` (Kubernetes 1.30+)."""
    return {NODE_NAME_EXTRA: [node], "authentication.kubernetes.io/pod-name": ["volcano-gpu-deviceplugin-x"]}


def daemon_request(
    node: str | None, operation: str, resource: str, obj: Doc, old: Doc | None = None, subresource: str = ""
) -> Request:
    """A request from the daemon's ServiceAccount whose pod runs on `node` (None: a token with no node)."""
    return Request(
        DAEMON_USER, operation, resource, obj, old, subresource, pod_token_extra(node) if node else {}
    )


@dataclass(frozen=True)
class Verdict:
    applies: bool  # the policy matched the request
    denials: tuple[str, ...] = ()  # the messages of the validations that denied it

    @property
    def allowed(self) -> bool:
        return not self.denials


def compile_expression(expression: str) -> Any:
    """The compiled expression; raises when it does not parse or type-check."""
    return _ENV.compile(expression)


def _eval(expression: str, data: Mapping[str, Any]) -> tuple[Any, str]:
    value = compile_expression(expression).eval(data=dict(data))
    if value.type() == cel.Type.ERROR:
        return None, str(value.value())
    return value.plain_value(), ""


def policies() -> list[Doc]:
    return [doc for doc in documents(POLICY_FILE) if doc["kind"] == "ValidatingAdmissionPolicy"]


def policy(name: str) -> Doc:
    return find(documents(POLICY_FILE), "ValidatingAdmissionPolicy", name)


def _rule_matches(rules: list[Doc], request: Request) -> bool:
    resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    return any(
        "" in rule["apiGroups"]
        and "v1" in rule["apiVersions"]
        and request.operation in rule["operations"]
        and resource in rule["resources"]
        for rule in rules
    )


def evaluate(policy_doc: Doc, request: Request) -> Verdict:
    """The policy's answer to the request, as the API server gives it."""
    spec = policy_doc["spec"]
    assert spec["failurePolicy"] == "Fail"
    if not _rule_matches(spec["matchConstraints"]["resourceRules"], request):
        return Verdict(applies=False)
    data: dict[str, Any] = {"object": request.obj, "oldObject": request.old, "request": request.as_cel()}
    for condition in spec.get("matchConditions", []):
        value, error = _eval(condition["expression"], data)
        if error:
            return Verdict(applies=True, denials=(f"match condition {condition['name']}: {error}",))
        if value is not True:
            return Verdict(applies=False)
    variables: dict[str, Any] = {}
    data["variables"] = variables
    for variable in spec.get("variables", []):
        value, error = _eval(variable["expression"], data)
        if not error:  # a failed variable is absent: only expressions that read it fail
            variables[variable["name"]] = value
    denials = []
    for validation in spec["validations"]:
        value, error = _eval(validation["expression"], data)
        if error:
            denials.append(f"{validation['message']} (expression failed: {error})")
        elif value is not True:
            denials.append(str(validation["message"]))
    return Verdict(applies=True, denials=tuple(denials))


def verdicts(request: Request, path: Path = POLICY_FILE) -> list[tuple[str, Verdict]]:
    """Every policy's answer, by policy name."""
    return [
        (doc["metadata"]["name"], evaluate(doc, request))
        for doc in documents(path)
        if doc["kind"] == "ValidatingAdmissionPolicy"
    ]


def admitted(request: Request) -> tuple[bool, list[str]]:
    """Whether every policy that applies allows the request, and the denials if not."""
    denials = [f"{name}: {message}" for name, verdict in verdicts(request) for message in verdict.denials]
    return not denials, denials


def recorded_writes(
    apiserver: ApiServerEmulator, since: int, user: str, extra: Mapping[str, list[str]]
) -> list[Request]:
    """Every write the emulator committed after resourceVersion `since`, as the admission request
    `user` made it with: node and pod updates (through `/status` when the status changed, the only
    way a status changes) and event creations. Pods and nodes created meanwhile are the test's own."""
    found: list[Request] = []
    for plural in ("nodes", "pods", "events"):
        feed = apiserver.store.watch(BY_PLURAL[plural], "", since)
        try:
            while isinstance(change := feed.next(0), Change):
                if plural == "events" and change.type == "ADDED":
                    found.append(Request(user, "CREATE", plural, change.obj, extra=extra))
                elif change.type == "MODIFIED" and change.prev is not None:
                    status = change.obj.get("status") != change.prev.get("status")
                    subresource = "status" if status else ""
                    found.append(Request(user, "UPDATE", plural, change.obj, change.prev, subresource, extra))
        finally:
            feed.close()
    return found
