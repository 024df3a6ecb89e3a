"""Where the facts come from: the kubeconfig to use, and the nodes and pods read from the API server."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.kube.api import ApiError, ConfigError, Kube, Obj, load_client

EXIT_API = 1
EXIT_USAGE = 2


class InspectError(Exception):
    """A failure to report to the user, with the exit code it maps to."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The nodes to show (in name order), each with the pods bound to it."""

    server: str
    nodes: tuple[tuple[Obj, tuple[Obj, ...]], ...]


def resolve_kubeconfig(flag: Path | None, env: Mapping[str, str] = os.environ) -> Path | None:
    """`--kubeconfig`, else the first existing file in `$KUBECONFIG`, else `~/.kube/config`, else
    None (in-cluster) when running in a pod. Anything else is a usage error."""
    if flag is not None:
        if not flag.is_file():
            raise InspectError(f"kubeconfig {flag} does not exist", EXIT_USAGE)
        return flag
    listed = [Path(item) for item in env.get("KUBECONFIG", "").split(os.pathsep) if item]
    if listed:
        for path in listed:
            if path.is_file():
                return path
        raise InspectError(f"none of the files in KUBECONFIG exists: {env['KUBECONFIG']}", EXIT_USAGE)
    default = Path(env.get("HOME") or Path.home()) / ".kube" / "config"
    if default.is_file():
        return default
    if env.get("KUBERNETES_SERVICE_HOST"):
        return None
    raise InspectError(f"no kubeconfig: pass --kubeconfig, set KUBECONFIG, or create {default}", EXIT_USAGE)


def connect(kubeconfig: Path | None) -> tuple[Kube, str]:
    """An API facade and the server address it talks to."""
    try:
        client = load_client(kubeconfig)
    except ConfigError as err:
        raise InspectError(str(err), EXIT_USAGE) from None
    return Kube(client), str(client.configuration.host)


def _api_failure(server: str, what: str, err: ApiError) -> InspectError:
    if err.status == 0:
        return InspectError(f"cannot reach the Kubernetes API server at {server}: {err}", EXIT_API)
    return InspectError(f"the Kubernetes API server at {server} refused to {what}: {err}", EXIT_API)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def fetch(kube: Kube, server: str, node_name: str | None) -> Snapshot:
    """One node (when named; a missing node is an error) or every node, with their bound pods."""
    if node_name is not None:
        try:
            node = kube.get_node(node_name)
        except ApiError as err:
            if err.status == 404:
                raise InspectError(f"node {node_name!r} not found on {server}", EXIT_API) from None
            raise _api_failure(server, f"read node {node_name!r}", err) from None
        try:
            pods, _ = kube.list_pods(f"spec.nodeName={node_name}")
        except ApiError as err:
            raise _api_failure(server, "list pods", err) from None
        return Snapshot(server, ((node, tuple(pods)),))
    try:
        nodes = kube.list_nodes()
        pods, _ = kube.list_pods("spec.nodeName!=")
    except ApiError as err:
        raise _api_failure(server, "list nodes and pods", err) from None
    by_node: defaultdict[str, list[Obj]] = defaultdict(list)
    for pod in pods:
        by_node[str((pod.get("spec") or {}).get("nodeName") or "")].append(pod)
    ordered = sorted(nodes, key=_name)
    return Snapshot(server, tuple((node, tuple(by_node.get(_name(node), ()))) for node in ordered))
