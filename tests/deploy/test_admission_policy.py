"""deploy/admission-policy.yaml: what it allows and refuses, evaluated as the API server evaluates it
(tests/deploy/admission.py). The cases below are the table of the policy's intent; the daemon's
and the extender's real writes are checked against it in test_rbac.py and tests/extender/test_rbac.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator
from tests.deploy.admission import (
    DAEMON_USER,
    EXTENDER_USER,
    POLICY_FILE,
    Request,
    admitted,
    compile_expression,
    daemon_request,
    evaluate,
    policies,
    policy,
)
from tests.deploy.manifests import DAEMONSET, EXTENDER, NAMESPACE, Doc, documents, find
from tests.sim.kubectl import MISSING, Kubectl, cells, find_kubectl, kubectl_for

ME, OTHER = "gpu-node-1", "gpu-node-2"


def node(name: str = ME) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {keys.GPU_MEMORY_FACTOR: "1", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": {"cpu": "8", "nvidia.com/gpu": "0", keys.GPU_NUMBER: "2"},
            "allocatable": {"cpu": "8", "nvidia.com/gpu": "0", keys.GPU_NUMBER: "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.30.0"},
        },
    }


def pod(node_name: str | None = ME) -> Doc:
    spec: Doc = {"containers": [{"name": "cuda", "image": "cuda:12"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"app": "train"},
            "annotations": {keys.GPU_INDEX: "0", keys.PREDICATE_TIME: "1"},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def changed(obj: Doc, change: Callable[[Doc], Any]) -> Doc:
    new = copy.deepcopy(obj)
    change(new)
    return new


def notes(obj: Doc) -> dict[str, str]:
    annotations: dict[str, str] = obj["metadata"].setdefault("annotations", {})
    return annotations


def labels(obj: Doc) -> dict[str, str]:
    found: dict[str, str] = obj["metadata"].setdefault("labels", {})
    return found


def node_update(change: Callable[[Doc], Any], name: str = ME, who: str | None = ME, sub: str = "") -> Request:
    old = node(name)
    return daemon_request(who, "UPDATE", "nodes", changed(old, change), old, sub)


def pod_update(change: Callable[[Doc], Any], on: str | None = ME, who: str | None = ME) -> Request:
    old = pod(on)
    return daemon_request(who, "UPDATE", "pods", changed(old, change), old)


def event(kind: str, name: str, host: str = ME, namespace: str = "ml") -> Doc:
    involved = {"kind": kind, "name": name, "apiVersion": "v1"}
    if kind == "Pod":
        involved["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace if kind == "Pod" else "default"},
        "involvedObject": involved,
        "reason": "GpuUnhealthy",
        "message": "x",
        "type": "Warning",
        "source": {"component": "volcano-gpu-deviceplugin", "host": host},
        "reportingComponent": "volcano-gpu-deviceplugin",
        "reportingInstance": host,
    }


def binding(annotations: dict[str, str]) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": OTHER},
    }


def set_status(section: str, resource: str, value: str) -> Callable[[Doc], None]:
    def change(obj: Doc) -> None:
        obj["status"][section][resource] = value

    return change


def both_sections(resource: str, value: str) -> Callable[[Doc], None]:
    def change(obj: Doc) -> None:
        for section in ("capacity", "allocatable"):
            obj["status"][section][resource] = value

    return change


# (case, request, None when admitted or a fragment of the denial)
CASES: list[tuple[str, Request, str | None]] = [
    # --- the node daemon on its node
    (
        "daemon writes volcano.sh/gpu-unhealthy-ids on its node",
        node_update(lambda n: notes(n).update({keys.GPU_UNHEALTHY_IDS: "1"})),
        None,
    ),
    (
        "daemon removes a volcano.sh annotation from its node",
        node_update(lambda n: notes(n).pop(keys.GPU_MEMORY_FACTOR)),
        None,
    ),
    (
        "daemon removes Volcano's share-mode node lock 'gpu'",
        Request(
            DAEMON_USER,
            "UPDATE",
            "nodes",
            node(),
            changed(node(), lambda n: notes(n).update({keys.GPUSHARE_LOCK: "2024-01-01T00:00:00Z"})),
            extra={"authentication.kubernetes.io/node-name": [ME]},
        ),
        None,
    ),
    (
        "daemon removes the vGPU node lock 'hamivgpu'",
        Request(
            DAEMON_USER,
            "UPDATE",
            "nodes",
            node(),
            changed(node(), lambda n: notes(n).update({keys.VGPU_LOCK: "2024-01-01T00:00:00Z"})),
            extra={"authentication.kubernetes.io/node-name": [ME]},
        ),
        None,
    ),
    (
        "daemon writes volcano.sh/gpu-number into its node's capacity and allocatable",
        node_update(both_sections(keys.GPU_NUMBER, "4"), sub="status"),
        None,
    ),
    (
        "daemon sets a node lock instead of removing it",
        node_update(lambda n: notes(n).update({keys.GPUSHARE_LOCK: "x"})),
        "only volcano.sh/ annotations",
    ),
    (
        "daemon changes an annotation outside volcano.sh/",
        node_update(lambda n: notes(n).update({"node.alpha.kubernetes.io/ttl": "30"})),
        "only volcano.sh/ annotations",
    ),
    (
        "daemon removes an annotation outside volcano.sh/",
        node_update(lambda n: notes(n).pop("node.alpha.kubernetes.io/ttl")),
        "only volcano.sh/ annotations",
    ),
    (
        "daemon writes a look-alike key (volcano.sh.evil/x)",
        node_update(lambda n: notes(n).update({"volcano.sh.evil/x": "1"})),
        "only volcano.sh/ annotations",
    ),
    (
        "daemon labels its node volcano.sh/gpu-strategy=share",
        node_update(lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "share"})),
        None,
    ),
    (
        "daemon restores its strategy label someone changed",
        Request(
            DAEMON_USER,
            "UPDATE",
            "nodes",
            changed(node(), lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "vgpu"})),
            changed(node(), lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "number"})),
            extra={"authentication.kubernetes.io/node-name": [ME]},
        ),
        None,
    ),
    (
        "daemon labels its node with another label",
        node_update(lambda n: labels(n).update({"gpu": "true"})),
        "no label but its node's volcano.sh/gpu-strategy",
    ),
    (
        "daemon labels its node with a look-alike key (volcano.sh/gpu-strategy2)",
        node_update(lambda n: labels(n).update({"volcano.sh/gpu-strategy2": "share"})),
        "no label but its node's volcano.sh/gpu-strategy",
    ),
    (
        "daemon sets its strategy label to no strategy",
        node_update(lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "all"})),
        "set to share, number, vgpu or whole",
    ),
    (
        "daemon labels its node with the whole strategy",
        node_update(lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "whole"})),
        None,
    ),
    (
        "daemon removes its node's strategy label",
        Request(
            DAEMON_USER,
            "UPDATE",
            "nodes",
            node(),
            changed(node(), lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "share"})),
            extra={"authentication.kubernetes.io/node-name": [ME]},
        ),
        "no label but its node's volcano.sh/gpu-strategy",
    ),
    (
        "daemon changes a label outside volcano.sh/ (kubernetes.io/hostname)",
        node_update(lambda n: labels(n).update({"kubernetes.io/hostname": "x"})),
        "no label but its node's volcano.sh/gpu-strategy",
    ),
    (
        "daemon taints its node",
        node_update(lambda n: n["spec"].update({"taints": [{"key": "x", "effect": "NoSchedule"}]})),
        "spec",
    ),
    (
        "daemon cordons its node",
        node_update(lambda n: n["spec"].update({"unschedulable": True})),
        "spec",
    ),
    (
        "daemon adds a finalizer to its node",
        node_update(lambda n: n["metadata"].update({"finalizers": ["x/y"]})),
        "finalizers",
    ),
    (
        "daemon changes nvidia.com/gpu in its node's capacity",
        node_update(set_status("capacity", "nvidia.com/gpu", "8"), sub="status"),
        "only volcano.sh/ resources",
    ),
    (
        "daemon removes cpu from its node's allocatable",
        node_update(lambda n: n["status"]["allocatable"].pop("cpu"), sub="status"),
        "only volcano.sh/ resources",
    ),
    (
        "daemon marks its node not Ready",
        node_update(
            lambda n: n["status"].update({"conditions": [{"type": "Ready", "status": "False"}]}), sub="status"
        ),
        "status",
    ),
    # --- the node daemon elsewhere
    (
        "daemon writes volcano.sh annotations on another node",
        node_update(lambda n: notes(n).update({keys.GPU_UNHEALTHY_IDS: "0"}), name=OTHER),
        "only the node it runs on",
    ),
    (
        "daemon writes volcano.sh/gpu-number into another node's status",
        node_update(both_sections(keys.GPU_NUMBER, "4"), name=OTHER, sub="status"),
        "only the node it runs on",
    ),
    (
        "a token that names no node (not from the DaemonSet's pods)",
        node_update(lambda n: notes(n).update({keys.GPU_UNHEALTHY_IDS: "1"}), who=None),
        "names no node",
    ),
    # --- pods
    (
        "daemon marks a pod on its node volcano.sh/gpu-assigned",
        pod_update(lambda p: notes(p).update({keys.GPU_ASSIGNED: "true"})),
        None,
    ),
    (
        "daemon writes vGPU bind-phase and devices-to-allocate on a pod on its node",
        pod_update(lambda p: notes(p).update({keys.BIND_PHASE: "success", keys.DEVICES_TO_ALLOCATE: ";"})),
        None,
    ),
    (
        "daemon marks a pod on another node",
        pod_update(lambda p: notes(p).update({keys.GPU_ASSIGNED: "true"}), on=OTHER),
        "only pods bound to the node it runs on",
    ),
    (
        "daemon marks a pod not bound to any node",
        pod_update(lambda p: notes(p).update({keys.GPU_ASSIGNED: "true"}), on=None),
        "only pods bound to the node it runs on",
    ),
    (
        "daemon changes a pod's image",
        pod_update(lambda p: p["spec"]["containers"][0].update({"image": "evil:1"})),
        "spec",
    ),
    (
        "daemon relabels a pod",
        pod_update(lambda p: labels(p).update({"app": "other"})),
        "no label but its node's volcano.sh/gpu-strategy",
    ),
    (
        "daemon puts the strategy label on a pod",
        pod_update(lambda p: labels(p).update({keys.GPU_STRATEGY_LABEL: "share"})),
        "no label but its node's volcano.sh/gpu-strategy",
    ),
    (
        "daemon labels another node with a strategy",
        node_update(lambda n: labels(n).update({keys.GPU_STRATEGY_LABEL: "share"}), name=OTHER),
        "only the node it runs on",
    ),
    (
        "daemon writes a pod annotation outside volcano.sh/",
        pod_update(lambda p: notes(p).update({"kubectl.kubernetes.io/restartedAt": "now"})),
        "only volcano.sh/ annotations",
    ),
    (
        "daemon removes the scheduler's node-lock key from a pod (locks are node annotations)",
        daemon_request(
            ME, "UPDATE", "pods", pod(), changed(pod(), lambda p: notes(p).update({keys.GPUSHARE_LOCK: "x"}))
        ),
        "only volcano.sh/ annotations",
    ),
    # --- events
    (
        "daemon posts an Event about a pod",
        daemon_request(ME, "CREATE", "events", event("Pod", "train")),
        None,
    ),
    ("daemon posts an Event about its node", daemon_request(ME, "CREATE", "events", event("Node", ME)), None),
    (
        "daemon posts an Event about another node",
        daemon_request(ME, "CREATE", "events", event("Node", OTHER)),
        "only about pods and about the node it runs on",
    ),
    (
        "daemon posts an Event as another node",
        daemon_request(ME, "CREATE", "events", event("Pod", "train", host=OTHER)),
        "only as the node it runs on",
    ),
    (
        "daemon posts an Event about a Secret",
        daemon_request(ME, "CREATE", "events", event("Secret", "creds")),
        "only about pods",
    ),
    # --- the extender
    (
        "extender binds with Volcano's share-mode annotations",
        Request(
            EXTENDER_USER,
            "CREATE",
            "pods",
            binding({keys.GPU_INDEX: "0", keys.PREDICATE_TIME: "1"}),
            None,
            "binding",
        ),
        None,
    ),
    (
        "extender binds a pod that asks for no GPU (no annotations)",
        Request(EXTENDER_USER, "CREATE", "pods", binding({}), None, "binding"),
        None,
    ),
    (
        "extender's Binding carries another annotation",
        Request(
            EXTENDER_USER,
            "CREATE",
            "pods",
            binding({keys.GPU_INDEX: "0", "sidecar.istio.io/inject": "false"}),
            None,
            "binding",
        ),
        "only volcano.sh/ annotations in a Binding",
    ),
    # --- nobody else is concerned
    (
        "kubelet updates its node's conditions",
        Request(
            "system:node:gpu-node-1",
            "UPDATE",
            "nodes",
            changed(node(), lambda n: n["status"].update({"conditions": []})),
            node(),
            "status",
        ),
        None,
    ),
    (
        "another ServiceAccount labels any node",
        Request(
            "system:serviceaccount:kube-system:admin",
            "UPDATE",
            "nodes",
            changed(node(OTHER), lambda n: n["metadata"]["labels"].update({"x": "y"})),
            node(OTHER),
        ),
        None,
    ),
    (
        "another ServiceAccount's Binding with any annotation",
        Request(
            "system:serviceaccount:kube-system:scheduler",
            "CREATE",
            "pods",
            binding({"a": "b"}),
            None,
            "binding",
        ),
        None,
    ),
]


@pytest.mark.parametrize(("case", "request_", "denied"), CASES, ids=[case for case, *_ in CASES])
def test_what_the_policy_allows_and_refuses(case: str, request_: Request, denied: str | None) -> None:
    allowed, denials = admitted(request_)
    if denied is None:
        assert allowed, denials
    else:
        assert not allowed, f"{case}: admitted"
        assert any(denied in message for message in denials), denials
        assert not any("expression failed" in message for message in denials), denials


def test_the_policies_apply_only_to_their_service_accounts() -> None:
    # the match conditions name the ServiceAccounts of the shipped manifests
    users = {
        f"system:serviceaccount:{NAMESPACE}:{doc['metadata']['name']}"
        for path in (DAEMONSET, EXTENDER)
        for doc in documents(path)
        if doc["kind"] == "ServiceAccount"
    }
    assert users == {DAEMON_USER, EXTENDER_USER}
    for doc in policies():
        (condition,) = doc["spec"]["matchConditions"]
        quoted = [
            user for user in users if f"request.userInfo.username == '{user}'" == condition["expression"]
        ]
        assert len(quoted) == 1, condition


def test_every_expression_compiles() -> None:
    for doc in policies():
        spec = doc["spec"]
        for item in [*spec.get("matchConditions", []), *spec.get("variables", []), *spec["validations"]]:
            compile_expression(item["expression"])


def test_every_policy_is_bound_to_deny() -> None:
    docs = documents(POLICY_FILE)
    names = {doc["metadata"]["name"] for doc in policies()}
    assert names == {"volcano-gpu-deviceplugin", "volcano-gpu-deviceplugin-events", "volcano-gpu-extender"}
    for name in names:
        bound = find(docs, "ValidatingAdmissionPolicyBinding", name)
        assert bound["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert policy(name)["spec"]["failurePolicy"] == "Fail"


def test_an_expression_that_fails_denies() -> None:
    # failurePolicy Fail: a pod the daemon patches has a spec; one that somehow has none is refused
    old = pod()
    del old["spec"]
    verdict = evaluate(policy("volcano-gpu-deviceplugin"), daemon_request(ME, "UPDATE", "pods", pod(), old))
    assert verdict.applies and not verdict.allowed


@pytest.fixture
def kubectl(apiserver: ApiServerEmulator, tmp_path: Path) -> Kubectl:
    binary = find_kubectl()
    if binary is None:
        pytest.skip(MISSING)
    return kubectl_for(binary, apiserver.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)


def test_the_api_emulator_accepts_the_policy_file(kubectl: Kubectl, apiserver: ApiServerEmulator) -> None:
    out = kubectl("apply", "-f", str(POLICY_FILE)).stdout
    for doc in documents(POLICY_FILE):
        resource = (
            "validatingadmissionpolicy"
            if doc["kind"] == "ValidatingAdmissionPolicy"
            else "validatingadmissionpolicybinding"
        )
        assert f"{resource}.admissionregistration.k8s.io/{doc['metadata']['name']} created" in out
    stored = apiserver.get("validatingadmissionpolicies", "volcano-gpu-deviceplugin")
    assert (
        stored is not None
        and stored["spec"]["validations"] == policy("volcano-gpu-deviceplugin")["spec"]["validations"]
    )
    rows = cells(kubectl("get", "validatingadmissionpolicybindings").stdout)
    assert [row[:2] for row in rows[1:]] == [
        [name, name] for name in sorted(doc["metadata"]["name"] for doc in policies())
    ]
    assert "unchanged" in kubectl("apply", "-f", str(POLICY_FILE)).stdout


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (
            lambda p: p["spec"]["validations"][0].update({"message": "two\nlines"}),
            "spec.validations[0].message: Invalid value",
        ),
        (lambda p: p["spec"].update({"failurePolicy": "Sometimes"}), "spec.failurePolicy: Unsupported value"),
        (
            lambda p: p["spec"]["variables"][0].update({"name": "node-name"}),
            "spec.variables[0].name: Invalid value",
        ),
        (
            lambda p: p["spec"]["matchConstraints"]["resourceRules"][0].update({"operations": ["PATCH"]}),
            "operations[0]: Unsupported value",
        ),
        (lambda p: p["spec"].pop("validations"), "spec.validations: Required value"),
    ],
)
def test_the_api_emulator_refuses_a_malformed_policy(
    kubectl: Kubectl, change: Callable[[Doc], Any], refused: str
) -> None:
    doc = copy.deepcopy(policy("volcano-gpu-deviceplugin"))
    change(doc)
    done = kubectl("apply", "-f", kubectl.manifest("policy.yaml", doc), check=False)
    assert done.returncode != 0 and refused in done.stderr, done.stderr


def test_the_api_emulator_refuses_a_binding_that_denies_and_warns(kubectl: Kubectl) -> None:
    doc = copy.deepcopy(
        find(documents(POLICY_FILE), "ValidatingAdmissionPolicyBinding", "volcano-gpu-extender")
    )
    doc["spec"]["validationActions"] = ["Deny", "Warn"]
    done = kubectl("apply", "-f", kubectl.manifest("binding.yaml", doc), check=False)
    assert done.returncode != 0 and "spec.validationActions: Invalid value" in done.stderr, done.stderr
