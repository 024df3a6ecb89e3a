"""Minimal node and pod objects for the API-facing tests."""

from __future__ import annotations

from typing import Any


def node_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}


def pod_object(name: str, node: str | None, namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
