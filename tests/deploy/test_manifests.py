"""The shipped manifests: valid against the Kubernetes schemas, and true to what the daemon and the
extender need (paths, probes, config keys, security settings, one image everywhere)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

from deviceplugin.config import DaemonConfig
from deviceplugin.extender.config import load_config as load_extender_config
from deviceplugin.fit.quantity import parse_quantity
from tests.deploy.manifests import (
    CLUSTER_KINDS,
    DAEMONSET,
    EXTENDER,
    IMAGE,
    MANIFESTS,
    NAMESPACE,
    POD_IP,
    ROOT,
    SCHEDULER_CONFIG_KEY,
    SCHEDULER_CONFIG_MAP,
    Doc,
    config_file,
    container_env,
    daemon_config,
    documents,
    expand,
    find,
    images,
    mounts,
    only_container,
    pod_spec,
    port_number,
    volumes,
)

# A fixed Kubernetes version whose schemas kubernetes-validate ships (every release from 1.30 on
# carries them): the manifests must be valid for clusters from this version up.
KUBERNETES_VERSION = "1.30.0"


def _doc_ids() -> list[tuple[Path, int, str]]:
    return [
        (path, index, f"{path.name}:{doc['kind']}/{doc['metadata']['name']}")
        for path in MANIFESTS
        for index, doc in enumerate(documents(path))
    ]


@pytest.mark.parametrize(
    ("path", "index"), [(p, i) for p, i, _ in _doc_ids()], ids=[n for *_, n in _doc_ids()]
)
def test_every_document_is_valid_for_kubernetes(path: Path, index: int) -> None:
    doc = documents(path)[index]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(part) for part in err.path)
        pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {where}: {err.message}")


def test_everything_lives_in_one_namespace() -> None:
    for path in MANIFESTS:
        for doc in documents(path):
            if doc["kind"] == "Namespace":
                assert doc["metadata"]["name"] == NAMESPACE
            elif doc["kind"] not in CLUSTER_KINDS:
                assert doc["metadata"]["namespace"] == NAMESPACE, f"{path.name} {doc['kind']}"
    find(documents(DAEMONSET), "Namespace", NAMESPACE)
    # declared once: `kubectl delete -f deploy/extender.yaml` must not take the daemons with it
    assert not [doc for doc in documents(EXTENDER) if doc["kind"] == "Namespace"]


def test_one_image_everywhere() -> None:
    used = [image for path in MANIFESTS for image in images(documents(path))]
    assert used and set(used) == {IMAGE}
    assert f"docker build -t {IMAGE} ." in (ROOT / "Dockerfile").read_text()
    found = set(
        re.findall(r"ghcr\.io/volcano-gpu/deviceplugin:[\w.-]+", (ROOT / "docs/deploy.md").read_text())
    )
    assert found == {IMAGE}


def _bindings_point_at_their_roles(docs: list[Doc], name: str) -> None:
    binding = find(docs, "ClusterRoleBinding", name)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": name,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    find(docs, "ServiceAccount", name)


# ---------------------------------------------------------------------------- the daemon


@pytest.fixture(scope="module")
def daemon_docs() -> list[Doc]:
    return documents(DAEMONSET)


@pytest.fixture(scope="module")
def daemonset(daemon_docs: list[Doc]) -> Doc:
    return find(daemon_docs, "DaemonSet", "volcano-gpu-deviceplugin")


@pytest.fixture
def config(daemon_docs: list[Doc], daemonset: Doc, tmp_path: Path) -> DaemonConfig:
    return daemon_config(daemon_docs, daemonset, tmp_path, node="gpu-node-7")


def test_the_config_file_parses_with_the_daemons_own_code(config: DaemonConfig) -> None:
    # load_config refuses unknown keys and bad values; the node name comes from the downward API
    assert config.node_name == "gpu-node-7"
    assert config.gpu_strategy == "share"
    assert config.fake_gpus is None and config.kubeconfig is None  # real NVML, in-cluster credentials


def test_node_name_comes_from_the_downward_api(daemonset: Doc) -> None:
    env = {entry["name"]: entry for entry in only_container(daemonset)["env"]}
    assert env["NODE_NAME"] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


def test_every_host_path_the_daemon_uses_is_mounted_at_the_same_path(
    daemonset: Doc, config: DaemonConfig
) -> None:
    container = only_container(daemonset)
    by_path, by_name = mounts(container), volumes(daemonset)
    wanted = {
        "device-plugin-dir": (config.device_plugin_dir, False),
        "pod-resources socket dir": (config.pod_resources_socket.parent, True),
        "state-dir": (config.state_dir, False),
        "hook-path": (config.hook_path, False),
    }
    for what, (path, read_only) in wanted.items():
        mount = by_path.get(str(path))
        assert mount is not None, f"{what} {path} is not mounted"
        host = by_name[mount["name"]].get("hostPath")
        assert host is not None and host["path"] == str(path), (
            f"{what}: {mount['name']} is not hostPath {path}"
        )
        assert bool(mount.get("readOnly")) == read_only, what
    assert str(config.kubelet_socket.parent) == "/var/lib/kubelet/device-plugins"
    assert str(config.pod_resources_socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    host_paths = {v["hostPath"]["path"] for v in by_name.values() if "hostPath" in v}
    assert host_paths == {str(path) for path, _ in wanted.values()}  # and no other host path


def test_probes_hit_healthz_and_readyz_on_the_metrics_port(daemonset: Doc, config: DaemonConfig) -> None:
    container = only_container(daemonset)
    metrics_port = int(config.metrics_address.rpartition(":")[2])
    assert {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"} in container["ports"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert port_number(container, get["port"]) == metrics_port
    # the pod IP, where kubelet's probes and Prometheus connect; not every interface
    assert config.metrics_address == f"{POD_IP}:{metrics_port}"


def test_runs_as_root_without_any_capability(daemonset: Doc) -> None:
    spec = pod_spec(daemonset)
    security = only_container(daemonset)["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsUser"] == 0  # the image's default user is 65532; see docs/deploy.md
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(spec.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))


def test_never_two_daemons_on_one_node(daemonset: Doc) -> None:
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_scheduling_and_resources(daemonset: Doc) -> None:
    spec = pod_spec(daemonset)
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerations = {(t["key"], t.get("effect")) for t in spec["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("CriticalAddonsOnly", None)} <= tolerations
    resources = only_container(daemonset)["resources"]
    mib = 1 << 20
    assert parse_quantity(resources["limits"]["memory"]) >= 160 * mib  # RSS bar is 120 MB
    assert parse_quantity(resources["requests"]["memory"]) <= parse_quantity(resources["limits"]["memory"])


def test_daemon_role_is_bound_to_its_service_account(daemon_docs: list[Doc], daemonset: Doc) -> None:
    _bindings_point_at_their_roles(daemon_docs, "volcano-gpu-deviceplugin")
    assert pod_spec(daemonset)["serviceAccountName"] == "volcano-gpu-deviceplugin"


# ---------------------------------------------------------------------------- the extender


@pytest.fixture(scope="module")
def extender_docs() -> list[Doc]:
    return documents(EXTENDER)


def test_extender_role_is_bound_to_its_service_account(extender_docs: list[Doc]) -> None:
    # What the role grants is checked against the extender's real calls in tests/extender/test_rbac.py.
    _bindings_point_at_their_roles(extender_docs, "volcano-gpu-extender")


def test_extender_deployment(extender_docs: list[Doc]) -> None:
    deployment = find(extender_docs, "Deployment", "volcano-gpu-extender")
    container = only_container(deployment)
    spec = pod_spec(deployment)
    assert spec["serviceAccountName"] == "volcano-gpu-extender"
    assert container["args"][:3] == ["extender", "--address", "$(POD_IP):8888"]  # its Service's target
    assert container_env(container, {}) == {"POD_IP": POD_IP}
    assert port_number(container, "http") == 8888
    assert port_number(container, container["readinessProbe"]["httpGet"]["port"]) == 8888
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    service = find(extender_docs, "Service", "volcano-gpu-extender")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8888, "http")]


def test_extender_config_file_loads_with_the_extenders_own_code(
    extender_docs: list[Doc], tmp_path: Path
) -> None:
    deployment = find(extender_docs, "Deployment", "volcano-gpu-extender")
    container = only_container(deployment)
    env = container_env(container, {})
    command, *rest = (expand(arg, env) for arg in container["args"])
    assert command == "extender" and len(rest) % 2 == 0
    flags: dict[str, object | None] = {}
    for flag, value in zip(rest[::2], rest[1::2], strict=True):
        assert flag.startswith("--")
        flags[flag[2:]] = value
    key, content = config_file(extender_docs, container, deployment, str(flags["config"]))
    (tmp_path / key).write_text(content)
    flags["config"] = str(tmp_path / key)
    config = load_extender_config(flags, env={})  # unknown keys and bad values are errors
    assert (config.address, config.strategy, config.policy) == (f"{POD_IP}:8888", "share", "binpack")
    assert config.weight > 0 and config.kubeconfig is None  # in-cluster credentials
    assert set(yaml.safe_load(content)) == {"strategy", "policy", "weight"}


# kube-scheduler's configuration has no OpenAPI schema in kubernetes-validate: the fields below
# are those of the kubescheduler.config.k8s.io/v1 Go types (KubeSchedulerConfiguration,
# KubeSchedulerProfile, Extender, ExtenderManagedResource, ExtenderTLSConfig), which kube-scheduler
# decodes strictly (an unknown field is an error).
_STR, _BOOL, _INT = str, bool, int
_LEADER_ELECTION = {
    "leaderElect": _BOOL,
    "leaseDuration": _STR,
    "renewDeadline": _STR,
    "retryPeriod": _STR,
    "resourceLock": _STR,
    "resourceName": _STR,
    "resourceNamespace": _STR,
}
_CLIENT = {"kubeconfig": _STR, "acceptContentTypes": _STR, "contentType": _STR, "qps": float, "burst": _INT}
_TLS = {
    "insecure": _BOOL,
    "serverName": _STR,
    "certFile": _STR,
    "keyFile": _STR,
    "caFile": _STR,
    "certData": _STR,
    "keyData": _STR,
    "caData": _STR,
}
_EXTENDER = {
    "urlPrefix": _STR,
    "filterVerb": _STR,
    "preemptVerb": _STR,
    "prioritizeVerb": _STR,
    "weight": _INT,
    "bindVerb": _STR,
    "enableHTTPS": _BOOL,
    "tlsConfig": _TLS,
    "httpTimeout": _STR,
    "nodeCacheCapable": _BOOL,
    "managedResources": [{"name": _STR, "ignoredByScheduler": _BOOL}],
    "ignorable": _BOOL,
}
_PROFILE = {"schedulerName": _STR, "percentageOfNodesToScore": _INT, "plugins": dict, "pluginConfig": list}
_SCHEDULER_CONFIGURATION = {
    "apiVersion": _STR,
    "kind": _STR,
    "parallelism": _INT,
    "leaderElection": _LEADER_ELECTION,
    "clientConnection": _CLIENT,
    "enableProfiling": _BOOL,
    "enableContentionProfiling": _BOOL,
    "percentageOfNodesToScore": _INT,
    "podInitialBackoffSeconds": _INT,
    "podMaxBackoffSeconds": _INT,
    "profiles": [_PROFILE],
    "extenders": [_EXTENDER],
    "delayCacheUntilActive": _BOOL,
}


def _conforms(value: Any, shape: Any, where: str) -> list[str]:
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected a mapping"]
        problems = [f"{where}.{key}: unknown field" for key in value if key not in shape]
        for key, sub in value.items():
            if key in shape:
                problems += _conforms(sub, shape[key], f"{where}.{key}")
        return problems
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [p for i, item in enumerate(value) for p in _conforms(item, shape[0], f"{where}[{i}]")]
    if shape is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, shape) and (shape is bool or not isinstance(value, bool))
    return [] if ok else [f"{where}: expected {shape.__name__}, got {value!r}"]


@pytest.fixture(scope="module")
def scheduler_config(extender_docs: list[Doc]) -> Doc:
    config_map = find(extender_docs, "ConfigMap", SCHEDULER_CONFIG_MAP)
    assert list(config_map["data"]) == [SCHEDULER_CONFIG_KEY]
    loaded: Doc = yaml.safe_load(config_map["data"][SCHEDULER_CONFIG_KEY])
    return loaded


def test_scheduler_configuration_has_only_known_fields(scheduler_config: Doc) -> None:
    assert scheduler_config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert scheduler_config["kind"] == "KubeSchedulerConfiguration"
    assert _conforms(scheduler_config, _SCHEDULER_CONFIGURATION, "config") == []


def test_scheduler_extender_entry(scheduler_config: Doc, extender_docs: list[Doc]) -> None:
    (extender,) = scheduler_config["extenders"]
    service = find(extender_docs, "Service", "volcano-gpu-extender")
    assert extender["urlPrefix"] == (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:"
        f"{service['spec']['ports'][0]['port']}"
    )
    assert extender["urlPrefix"] == "http://volcano-gpu-extender.volcano-gpu.svc:8888"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["weight"] == 1  # kube-scheduler: must be positive when prioritizeVerb is set
    assert extender["nodeCacheCapable"] is True and extender["enableHTTPS"] is False
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert len(managed) == len(extender["managedResources"])  # kube-scheduler refuses duplicates
    assert managed == {
        "volcano.sh/gpu-memory": False,
        "volcano.sh/gpu-number": False,
        "volcano.sh/vgpu-number": False,
        "volcano.sh/vgpu-memory": False,
        "volcano.sh/vgpu-cores": False,
        "volcano.sh/vgpu-memory-percentage": True,  # requested by pods, advertised by no node
        "huawei.com/Ascend310P": False,
        "huawei.com/Ascend310P-memory": True,  # advertised by no node: the extender fits them
        "huawei.com/Ascend310P-core": True,
    }
    profiles = [p["schedulerName"] for p in scheduler_config["profiles"]]
    assert len(profiles) == len(set(profiles))
