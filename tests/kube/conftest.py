"""An API-server emulator over real HTTP and the daemon's client for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.kube.api import Kube, load_client
from deviceplugin.sim.apiserver import ApiServerEmulator


@pytest.fixture
def apiserver() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator(bookmark_interval_s=0.5) as server:
        yield server


@pytest.fixture
def kube(apiserver: ApiServerEmulator, tmp_path: Path) -> Kube:
    return Kube(load_client(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))


def node_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}


def pod_object(name: str, node: str | None, namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
