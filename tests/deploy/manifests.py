"""Reading the shipped manifests: documents by kind and name, containers, RBAC rules, and the
daemon's effective configuration as the DaemonSet would give it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import yaml

from deviceplugin.cli import build_parser
from deviceplugin.config import CONFIG_OPTION, OPTIONS, DaemonConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DAEMONSET = ROOT / "daemonset.yaml"
EXTENDER = ROOT / "deploy" / "extender.yaml"
VGPU_CONFIG = ROOT / "deploy" / "vgpu-config.yaml"  # the HAMi vGPU plugin's ConfigMaps
ADMISSION_POLICY = ROOT / "deploy" / "admission-policy.yaml"  # ValidatingAdmissionPolicies and bindings
NETWORK_POLICY = ROOT / "deploy" / "networkpolicy.yaml"  # ingress to the metrics port and the extender
MANIFESTS = (DAEMONSET, EXTENDER, VGPU_CONFIG, ADMISSION_POLICY, NETWORK_POLICY)
# Cluster-scoped kinds the manifests hold; everything else lives in NAMESPACE.
CLUSTER_KINDS = frozenset(
    {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)
NAMESPACE = "volcano-gpu"
POD_IP = "10.244.3.17"  # the pod IP the downward API gives in these tests
IMAGE = "ghcr.io/volcano-gpu/deviceplugin:0.1.0"
SCHEDULER_CONFIG_MAP = "volcano-gpu-scheduler-config"
SCHEDULER_CONFIG_KEY = "scheduler-config.yaml"

Doc = dict[str, Any]


def documents(path: Path) -> list[Doc]:
    loaded = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert all(isinstance(doc, dict) for doc in loaded), f"{path}: every document must be a mapping"
    return loaded


def find(docs: Iterable[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def only_container(workload: Doc) -> Doc:
    (container,) = pod_spec(workload)["containers"]
    return dict(container)


def volumes(workload: Doc) -> dict[str, Doc]:
    return {volume["name"]: volume for volume in pod_spec(workload).get("volumes", [])}


def mounts(container: Doc) -> dict[str, Doc]:
    """mountPath → volumeMount."""
    return {mount["mountPath"]: mount for mount in container.get("volumeMounts", [])}


def images(docs: Iterable[Doc]) -> Iterator[str]:
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            yield container["image"]


def port_number(container: Doc, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return int(number)


# ---------------------------------------------------------------------------- RBAC


@dataclass(frozen=True, order=True)
class Access:
    """One permission as RBAC sees it: API group, resource (with `/subresource`), verb."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.group + '/' if self.group else ''}{self.resource}"


def granted(cluster_role: Doc) -> set[Access]:
    """Every (group, resource, verb) the ClusterRole's rules grant; wildcards are refused."""
    access: set[Access] = set()
    for rule in cluster_role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    access.add(Access(group, resource, verb))
    return access


def request_access(method: str, path: str, query: str) -> Access:
    """The RBAC permission an API request needs, worked out the way the API server's request-info
    resolver does: the verb from the method, and for GET whether it names one object, asks for a
    watch (`watch=true`, or the legacy /watch/ path) or a list."""
    parts = [part for part in path.split("/") if part]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        raise AssertionError(f"not a resource request: {method} {path}")
    legacy_watch = rest[:1] == ["watch"]
    if legacy_watch:
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaced: /namespaces/<ns>/<resource>/...
    assert rest, f"no resource in {path}"
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2:]
    if sub:
        resource = f"{resource}/{sub[0]}"
    params = parse_qs(query)
    watching = legacy_watch or params.get("watch", ["false"])[0].lower() in {"true", "1"}
    if method == "GET":
        verb = "watch" if watching else "get" if name else "list"
    else:
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }[method]
    return Access(group, resource, verb)


# ---------------------------------------------------------------------------- daemon config


def config_file(docs: list[Doc], container: Doc, workload: Doc, file_path: str) -> tuple[str, str]:
    """(ConfigMap key, content) of the file at `file_path` in the container's mounted ConfigMaps."""
    directory, _, key = file_path.rpartition("/")
    mount = mounts(container).get(directory)
    assert mount is not None, f"{file_path}: nothing mounted at {directory}"
    source = volumes(workload)[mount["name"]].get("configMap")
    assert source is not None, f"{directory} is not a ConfigMap volume"
    config_map = find(docs, "ConfigMap", source["name"])
    assert config_map["metadata"]["namespace"] == workload["metadata"]["namespace"]
    assert key in config_map["data"], f"ConfigMap {source['name']} has no key {key}"
    return key, str(config_map["data"][key])


def container_env(container: Doc, field_values: Mapping[str, str]) -> dict[str, str]:
    """The container's environment; downward-API fields are filled from `field_values` (the pod
    IP is `POD_IP` unless given), `$(NAME)` in a value from the variables defined before it."""
    fields = {"status.podIP": POD_IP, **field_values}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(str(entry["value"]), env)
        else:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            env[entry["name"]] = fields[field]
    return env


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(NAME)` references in an env value or an argument (unknown ones stay)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def daemon_config(docs: list[Doc], workload: Doc, scratch: Path, node: str) -> DaemonConfig:
    """Resolve the daemon's options with the project's own code, from the container's args and
    env and the mounted config file (copied into `scratch`), as `deviceplugin run` would."""
    container = only_container(workload)
    env = container_env(container, {"spec.nodeName": node})
    assert "command" not in container, "the image's ENTRYPOINT (deviceplugin) runs; args pick the command"
    args = build_parser().parse_args(container.get("args", []))
    assert args.command == "run"
    flags: dict[str, str | None] = {
        option.name: getattr(args, option.field) for option in (*OPTIONS, CONFIG_OPTION)
    }
    config_env = CONFIG_OPTION.env
    assert config_env is not None
    in_pod = flags[CONFIG_OPTION.name] or env.get(config_env)
    assert in_pod, "the DaemonSet gives the daemon no config file"
    key, content = config_file(docs, container, workload, in_pod)
    local = scratch / key
    local.write_text(content)
    if flags[CONFIG_OPTION.name]:
        flags[CONFIG_OPTION.name] = str(local)
    else:
        env[config_env] = str(local)
    return load_config(flags, env)
