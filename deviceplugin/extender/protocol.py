"""The kube-scheduler extender v1 wire format (k8s.io/kube-scheduler/extender/v1), read and written.

The Go types carry no JSON tags, so the field names are the Go names (`Pod`, `NodeNames`,
`FailedNodes`, ...); Go's decoder matches them case-insensitively, and so does this reader.
A body of the wrong shape raises `BadRequest`, answered with HTTP 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deviceplugin.kube.api import Obj

MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority


class BadRequest(ValueError):
    """The request body is not what the endpoint takes; the message says what is wrong."""


def _fields(body: object, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object, not {type(body).__name__}")
    return {str(key).lower(): value for key, value in body.items()}


def _string(fields: dict[str, Any], name: str, what: str, *, required: bool) -> str:
    value = fields.get(name.lower())
    if value is None or value == "":
        if required:
            raise BadRequest(f"{what}.{name} is required")
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{what}.{name} must be a string, not {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize request: the pod and its candidate nodes, as objects (`nodes`, when the
    scheduler is not nodeCacheCapable) or as names (`node_names`)."""

    pod: Obj
    nodes: list[Obj] | None
    node_names: list[str]

    @property
    def by_name(self) -> bool:
        return self.nodes is None


def parse_extender_args(body: object) -> ExtenderArgs:
    fields = _fields(body, "ExtenderArgs")
    pod = fields.get("pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise BadRequest("ExtenderArgs.Pod must be a pod object with metadata")
    if not pod["metadata"].get("name") and not pod["metadata"].get("uid"):
        raise BadRequest("ExtenderArgs.Pod has neither metadata.name nor metadata.uid")
    node_list, names = fields.get("nodes"), fields.get("nodenames")
    if node_list is not None:
        if not isinstance(node_list, dict) or not isinstance(node_list.get("items") or [], list):
            raise BadRequest("ExtenderArgs.Nodes must be a NodeList object with an items list")
        items = node_list.get("items") or []
        nodes: list[Obj] = []
        for n, node in enumerate(items):
            metadata = node.get("metadata") if isinstance(node, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{n}] is not a node object with metadata.name")
            nodes.append(node)
        return ExtenderArgs(pod, nodes, [node["metadata"]["name"] for node in nodes])
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise BadRequest("ExtenderArgs.NodeNames must be a list of node names")
        return ExtenderArgs(pod, None, list(names))
    raise BadRequest("ExtenderArgs needs Nodes (NodeList) or NodeNames")


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def pod_display(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def parse_binding_args(body: object) -> BindingArgs:
    fields = _fields(body, "ExtenderBindingArgs")
    what = "ExtenderBindingArgs"
    return BindingArgs(
        pod_name=_string(fields, "PodName", what, required=True),
        pod_namespace=_string(fields, "PodNamespace", what, required=False) or "default",
        pod_uid=_string(fields, "PodUID", what, required=False),
        node=_string(fields, "Node", what, required=True),
    )


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult, answering in the form the request used (objects or names)."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }
    if args.nodes is not None:
        keep = set(passed)
        result["Nodes"] = {
            "apiVersion": "v1",
            "kind": "NodeList",
            "metadata": {},
            "items": [node for node in args.nodes if node["metadata"]["name"] in keep],
        }
    else:
        result["NodeNames"] = passed
    return result


def host_priorities(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList."""
    return [{"Host": host, "Score": score} for host, score in scores]


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": error}
