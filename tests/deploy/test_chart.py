"""The Helm chart (charts/volcano-gpu) with the real helm: lint-clean and valid for Kubernetes under
several value sets, each value reaching the fields it names (read back with the daemon's and the
extender's own config code), bad values refused by name, and the plain manifests its rendering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # ships no type information
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

from deviceplugin.config import load_config
from deviceplugin.extender.config import load_config as load_extender_config
from tests.deploy.manifests import (
    IMAGE,
    NAMESPACE,
    POD_IP,
    ROOT,
    SCHEDULER_CONFIG_KEY,
    SCHEDULER_CONFIG_MAP,
    Doc,
    config_file,
    container_env,
    daemon_config,
    expand,
    find,
    images,
    only_container,
    pod_spec,
)
from tests.deploy.test_manifests import KUBERNETES_VERSION
from tests.test_config import flags
from tests.tools import find_tool, missing

CHART = ROOT / "charts" / "volcano-gpu"
HELM = find_tool("helm")
pytestmark = pytest.mark.skipif(HELM is None, reason=missing("helm"))

DAEMON = "volcano-gpu-deviceplugin"
EXTENDER = "volcano-gpu-extender"
NODE = "gpu-node-1"
RUN_TIMEOUT_S = 60

CUSTOM_SCHEDULING: dict[str, Any] = {
    "image": {"repository": "registry.example/gpu/deviceplugin", "tag": "1.2.3", "pullPolicy": "Always"},
    "daemon": {
        # helm merges maps with the defaults: null drops the default GPU label, lists replace theirs
        "nodeSelector": {"gpu": "a100", "nvidia.com/gpu.present": None},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "runtimeClassName": "nvidia",
        "resources": {
            "requests": {"cpu": "10m", "memory": "64Mi"},
            "limits": {"cpu": None, "memory": "256Mi"},
        },
    },
    "extender": {
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [],
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}},
    },
}
# name -> values file content (the chart's defaults below it)
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "share": {"strategy": "share"},
    "number": {"strategy": "number"},
    "whole": {"strategy": "whole"},
    "vgpu": {"strategy": "vgpu", "vgpu": {"upstreamConfigMaps": True, "splitCount": 4}},
    "mps": {"strategy": "vgpu", "vgpu": {"mode": "mps", "mps": {"shmSize": "16g"}}},
    "mps-sidecar": {"strategy": "vgpu", "vgpu": {"mode": "mps", "mps": {"sidecar": True}}},
    "spread": {"policy": "spread", "weight": 5, "memoryFactor": "auto"},
    "custom-scheduling": CUSTOM_SCHEDULING,
    "service-monitor": {"metrics": {"port": 9560, "serviceMonitor": {"enabled": True, "labels": {"r": "p"}}}},
    "extender-off": {
        "extender": {"enabled": False},
        "networkPolicy": {"enabled": True},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "everything": {
        "namespace": {"create": True},
        "networkPolicy": {"enabled": True},
        "vgpu": {"upstreamConfigMaps": True},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "no-admission-policy": {"admissionPolicy": {"enabled": False}},
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def values_file(values: dict[str, Any], where: Path) -> str:
    path = where / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def template(values: dict[str, Any], where: Path, namespace: str = NAMESPACE) -> list[Doc]:
    done = helm("template", "volcano-gpu", str(CHART), "-n", namespace, "-f", values_file(values, where))
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def refusal(values: dict[str, Any], where: Path) -> str:
    done = helm("template", "volcano-gpu", str(CHART), "-f", values_file(values, where))
    assert done.returncode != 0, f"{values} rendered"
    return done.stderr


def named(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in docs}


# ---------------------------------------------------------------------------- one source


def test_the_plain_manifests_are_the_charts_rendering() -> None:
    assert HELM is not None
    script = ROOT / "scripts" / "render_manifests.py"
    done = subprocess.run(
        [sys.executable, str(script), HELM, "--check"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr}\n{done.stdout}"


# ---------------------------------------------------------------------------- every value set


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lints_clean(name: str, tmp_path: Path) -> None:
    done = helm("lint", "--strict", str(CHART), "-f", values_file(VALUE_SETS[name], tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr


# The Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1), the fields the chart writes:
# a CRD, so kubernetes-validate has no schema for it; these are its CRD's types, closed.
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": _LABELS},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^(0|(([0-9]+)(ms|s|m|h))+)$"},
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_is_valid(name: str, tmp_path: Path) -> None:
    docs = template(VALUE_SETS[name], tmp_path)
    assert find(docs, "DaemonSet", DAEMON)
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            try:
                jsonschema.validate(doc, SERVICE_MONITOR)
            except jsonschema.ValidationError as err:
                pytest.fail(f"{name}: {where}: {'/'.join(map(str, err.path))}: {err.message}")
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{name}: {where}: {'/'.join(map(str, err.path))}: {err.message}")


# ---------------------------------------------------------------------------- values reach their fields


def extender_config_for(docs: list[Doc], where: Path) -> tuple[Any, dict[str, str]]:
    """The extender's configuration as its own code loads it from the Deployment's args and file."""
    deployment = find(docs, "Deployment", EXTENDER)
    container = only_container(deployment)
    env = container_env(container, {})
    _, *rest = (expand(arg, env) for arg in container["args"])
    given = dict(zip((flag.removeprefix("--") for flag in rest[::2]), rest[1::2], strict=True))
    key, content = config_file(docs, container, deployment, given["config"])
    (where / key).write_text(content)
    return load_extender_config({**given, "config": str(where / key)}, env={}), given


@pytest.mark.parametrize("strategy", ["share", "number", "vgpu", "whole"])
def test_strategy_reaches_the_daemon_and_the_extender(strategy: str, tmp_path: Path) -> None:
    docs = template({"strategy": strategy}, tmp_path)
    daemon = daemon_config(docs, find(docs, "DaemonSet", DAEMON), tmp_path, node=NODE)
    assert daemon.gpu_strategy == strategy
    extender, _ = extender_config_for(docs, tmp_path)
    assert extender.strategy == strategy


@pytest.mark.parametrize("strategy", ["share", "number", "vgpu", "whole"])
def test_kube_scheduler_sends_nvidia_gpu_pods_to_the_extender_only_when_it_runs_whole(
    strategy: str, tmp_path: Path
) -> None:
    """Elsewhere those pods are NVIDIA's plugin's, placed by kube-scheduler alone (docs/whole.md)."""
    docs = template({"strategy": strategy}, tmp_path)
    config = yaml.safe_load(find(docs, "ConfigMap", SCHEDULER_CONFIG_MAP)["data"][SCHEDULER_CONFIG_KEY])
    managed = {
        entry["name"]: entry["ignoredByScheduler"] for entry in config["extenders"][0]["managedResources"]
    }
    assert ("nvidia.com/gpu" in managed) == (strategy == "whole")
    assert managed.get("nvidia.com/gpu", False) is False  # kube-scheduler counts the devices too


def test_policy_weight_and_memory_factor_reach_their_configs(tmp_path: Path) -> None:
    docs = template({"policy": "spread", "weight": 5, "memoryFactor": 256}, tmp_path)
    extender, _ = extender_config_for(docs, tmp_path)
    assert (extender.policy, extender.weight) == ("spread", 5)
    daemon = daemon_config(docs, find(docs, "DaemonSet", DAEMON), tmp_path, node=NODE)
    assert daemon.gpu_memory_factor == 256
    auto = template({"memoryFactor": "auto"}, tmp_path)
    auto_daemonset = find(auto, "DaemonSet", DAEMON)
    assert daemon_config(auto, auto_daemonset, tmp_path, node=NODE).gpu_memory_factor == "auto"


@pytest.mark.parametrize("mode", ["hami-core", "mig", "mps"])
def test_vgpu_values_start_a_vgpu_daemon_on_the_upstream_config_maps(tmp_path: Path, mode: str) -> None:
    values = {"strategy": "vgpu", "vgpu": {"upstreamConfigMaps": True, "splitCount": 4, "mode": mode}}
    docs = template(values, tmp_path)
    daemonset = find(docs, "DaemonSet", DAEMON)
    container = only_container(daemonset)
    env = container_env(container, {"spec.nodeName": NODE})
    _, own = config_file(docs, container, daemonset, env["CONFIG_FILE"])
    settings = yaml.safe_load(own)
    for option in ("vgpu-device-config", "vgpu-node-config"):  # the ConfigMaps mounted where it points
        key, content = config_file(docs, container, daemonset, settings[option])
        (tmp_path / key).write_text(content)
        settings[option] = str(tmp_path / key)
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(settings))
    config = load_config(flags(config=str(tmp_path / "own.yaml")), {"NODE_NAME": NODE})
    assert (config.gpu_strategy, config.vgpu_split_count, config.vgpu_mode) == ("vgpu", 4, mode)
    assert any(f"nodeconfig[0] applies to node {NODE}" in note for note in config.notes)
    node_config = yaml.safe_load(find(docs, "ConfigMap", "volcano-vgpu-node-config")["data"]["config.json"])
    assert [entry["operatingmode"] for entry in node_config["nodeconfig"]] == [mode]


def coalesced(defaults: Any, given: Any) -> Any:
    """Values as helm combines them: maps merge key by key, null removes a default, the rest replaces."""
    if not (isinstance(defaults, dict) and isinstance(given, dict)):
        return given
    combined = {**defaults, **{key: coalesced(defaults.get(key), value) for key, value in given.items()}}
    return {key: value for key, value in combined.items() if value is not None}


def test_scheduling_image_and_resources_reach_the_pod_specs(tmp_path: Path) -> None:
    docs = template(CUSTOM_SCHEDULING, tmp_path)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for kind, name, part in (("DaemonSet", DAEMON, "daemon"), ("Deployment", EXTENDER, "extender")):
        spec = pod_spec(find(docs, kind, name))
        given = coalesced(defaults[part], CUSTOM_SCHEDULING[part])
        assert spec.get("nodeSelector", {}) == given["nodeSelector"], name
        assert spec.get("tolerations", []) == given["tolerations"], name
        container = only_container(find(docs, kind, name))
        assert container["resources"] == given["resources"], name
        assert container["imagePullPolicy"] == "Always"
    assert pod_spec(find(docs, "DaemonSet", DAEMON))["runtimeClassName"] == "nvidia"
    assert set(images(docs)) == {"registry.example/gpu/deviceplugin:1.2.3"}
    # a label added to the daemon's nodeSelector keeps the GPU nodes' one
    added = template({"daemon": {"nodeSelector": {"gpu": "a100"}}}, tmp_path)
    assert pod_spec(find(added, "DaemonSet", DAEMON))["nodeSelector"] == {
        "gpu": "a100",
        "nvidia.com/gpu.present": "true",
    }
    # the default image is the chart's appVersion, the one the docs and the Dockerfile name
    assert set(images(template({}, tmp_path))) == {IMAGE}


def test_metrics_port_and_service_monitors_reach_the_pods(tmp_path: Path) -> None:
    docs = template(VALUE_SETS["service-monitor"], tmp_path)
    daemonset = find(docs, "DaemonSet", DAEMON)
    container = only_container(daemonset)
    assert container_env(container, {"spec.nodeName": NODE})["METRICS_ADDRESS"] == f"{POD_IP}:9560"
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("metrics", 9560)]
    for workload in (daemonset, find(docs, "Deployment", EXTENDER)):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        pod_ports = {p["name"] for p in only_container(workload)["ports"]}
        name = workload["metadata"]["name"]
        monitor = find(docs, "ServiceMonitor", name)
        assert monitor["metadata"]["labels"]["r"] == "p"  # what Prometheus' selector matches
        (service,) = [
            doc
            for doc in docs
            if doc["kind"] == "Service"
            and monitor["spec"]["selector"]["matchLabels"].items() <= doc["metadata"]["labels"].items()
        ]
        assert service["spec"]["selector"].items() <= pod_labels.items(), name
        (endpoint,) = monitor["spec"]["endpoints"]
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        assert port["targetPort"] in pod_ports and endpoint["path"] == "/metrics", name
    assert not [doc for doc in template({}, tmp_path) if doc["kind"] == "ServiceMonitor"]


def test_extender_off_leaves_the_daemon_alone(tmp_path: Path) -> None:
    on = named(template(VALUE_SETS["everything"], tmp_path))
    off = named(template({**VALUE_SETS["everything"], "extender": {"enabled": False}}, tmp_path))
    assert {name for _, name in on - off} == {EXTENDER, SCHEDULER_CONFIG_MAP}
    assert ("DaemonSet", DAEMON) in off and ("ValidatingAdmissionPolicy", DAEMON) in off
    assert not {name for _, name in off if name == EXTENDER}


def test_optional_parts_switch_off(tmp_path: Path) -> None:
    docs = named(template({"admissionPolicy": {"enabled": False}}, tmp_path))
    assert not {kind for kind, _ in docs if kind.startswith("ValidatingAdmissionPolicy")}
    defaults = named(template({}, tmp_path))
    assert not {kind for kind, _ in defaults if kind in {"Namespace", "NetworkPolicy"}}


def test_the_release_namespace_reaches_every_reference(tmp_path: Path) -> None:
    docs = template(VALUE_SETS["everything"], tmp_path, namespace="gpu-system")
    for doc in docs:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == "gpu-system"
        elif "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == "gpu-system"
    subjects = [s for doc in docs if doc["kind"] == "ClusterRoleBinding" for s in doc["subjects"]]
    assert {s["namespace"] for s in subjects} == {"gpu-system"}
    users = [
        condition["expression"]
        for doc in docs
        if doc["kind"] == "ValidatingAdmissionPolicy"
        for condition in doc["spec"]["matchConditions"]
    ]
    assert users and all("'system:serviceaccount:gpu-system:volcano-gpu-" in user for user in users)
    scheduler = yaml.safe_load(find(docs, "ConfigMap", SCHEDULER_CONFIG_MAP)["data"][SCHEDULER_CONFIG_KEY])
    (entry,) = scheduler["extenders"]
    assert entry["urlPrefix"] == f"http://{EXTENDER}.gpu-system.svc:8888"


@pytest.mark.parametrize(
    ("values", "named_in_error"),
    [
        ({"strategy": "mig"}, "/strategy"),
        ({"policy": "random"}, "/policy"),
        ({"vgpu": {"mode": "mps-ish"}}, "/vgpu/mode"),
        ({"vgpu": {"mode": "mps"}}, "mig or mps needs strategy: vgpu, not share"),
        ({"memoryFactor": 0}, "/memoryFactor"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"memoryFactor": "auto", "vgpu": {"upstreamConfigMaps": True}}, "memoryFactor: auto"),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else None,
)
def test_bad_values_are_refused_by_name(values: dict[str, Any], named_in_error: str, tmp_path: Path) -> None:
    assert named_in_error in refusal(values, tmp_path)
