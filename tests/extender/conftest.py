"""Fixtures for the extender: GPU nodes and pods in the API-server emulator, a running extender,
and a small JSON-over-HTTP client speaking the kube-scheduler extender v1 format."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from deviceplugin.extender import Extender, ExtenderConfig
from deviceplugin.fit import GpuState, encode_node_register
from deviceplugin.kube.api import Kube
from kubesim.apiserver import ApiServerEmulator

Obj = dict[str, Any]
WAIT_S = 5.0


def share_node(
    name: str,
    gpus: int = 2,
    memory: int = 16000,
    *,
    unhealthy: str | None = None,
    memory_resource: bool = True,
) -> Obj:
    """A node as the plugin publishes it in share/number mode: capacity gpu-memory (all cards) and
    gpu-number (card count), `gpu-unhealthy-ids` when some GPUs are unhealthy."""
    resources = {"cpu": "8", "volcano.sh/gpu-number": str(gpus)}
    if memory_resource:
        resources["volcano.sh/gpu-memory"] = str(gpus * memory)
    annotations = {"volcano.sh/gpu-unhealthy-ids": unhealthy} if unhealthy else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def vgpu_node(name: str, gpus: int = 2, memory: int = 16000, *, unhealthy: tuple[int, ...] = ()) -> Obj:
    """A vGPU node: allocatable vgpu-number/memory/cores and the `node-vgpu-register` annotation."""
    states = [
        GpuState(
            index=i,
            uuid=gpu_uuid(name, i),
            type="NVIDIA-H100",
            memory=memory,
            split_count=10,
            health=i not in unhealthy,
        )
        for i in range(gpus)
    ]
    resources = {
        "cpu": "8",
        "volcano.sh/vgpu-number": str(gpus * 10),
        "volcano.sh/vgpu-memory": str(gpus * memory),
        "volcano.sh/vgpu-cores": str(gpus * 100),
    }
    return {
        "metadata": {
            "name": name,
            "annotations": {"volcano.sh/node-vgpu-register": encode_node_register(states)},
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def gpu_pod(
    name: str,
    limits: Mapping[str, str] | None = None,
    *,
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str | None = None,
) -> Obj:
    container: Obj = {"name": "main", "image": "cuda"}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    spec: Obj = {"containers": [container]}
    if node is not None:
        spec["nodeName"] = node
    pod: Obj = {
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations or {})},
        "spec": spec,
    }
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod


def memory_pod(name: str, memory: int, **kwargs: Any) -> Obj:
    return gpu_pod(name, {"volcano.sh/gpu-memory": str(memory)}, **kwargs)


def eventually(check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@dataclass
class Reply:
    status: int
    body: Any


class ExtenderClient:
    """kube-scheduler's side of the extender protocol, over one keep-alive connection per call."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    def request(self, method: str, path: str, body: bytes | None = None) -> Reply:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        return Reply(response.status, json.loads(data) if data else None)

    def post(self, path: str, body: object) -> Reply:
        return self.request("POST", path, json.dumps(body).encode())

    def filter(self, pod: Obj, names: list[str]) -> Obj:
        reply = self.post("/filter", {"Pod": pod, "NodeNames": names})
        assert reply.status == 200, reply.body
        result: Obj = reply.body
        return result

    def prioritize(self, pod: Obj, names: list[str]) -> dict[str, int]:
        reply = self.post("/prioritize", {"Pod": pod, "NodeNames": names})
        assert reply.status == 200, reply.body
        return {entry["Host"]: entry["Score"] for entry in reply.body}

    def bind(self, pod: Obj, node: str) -> str:
        meta = pod["metadata"]
        reply = self.post(
            "/bind",
            {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node},
        )
        assert reply.status == 200, reply.body
        error: str = reply.body["Error"]
        return error


@dataclass
class Running:
    extender: Extender
    client: ExtenderClient

    def sees_node(self, name: str) -> bool:
        view = self.extender.inventory.view(name)
        return view is not None and view.known


StartExtender = Callable[..., Running]


@pytest.fixture
def start_extender(kube: Kube, apiserver: ApiServerEmulator) -> Iterator[StartExtender]:
    """Start an extender against the emulator: `start_extender(strategy="vgpu", policy="spread")`."""
    running: list[Extender] = []

    def start(**options: Any) -> Running:
        extender = Extender(ExtenderConfig(**options), kube, address="127.0.0.1:0").start(WAIT_S)
        running.append(extender)
        assert extender.synced()
        return Running(extender, ExtenderClient(extender.url))

    yield start
    for extender in running:
        extender.stop()


def create_pod(apiserver: ApiServerEmulator, pod: Obj) -> Obj:
    created: Obj = apiserver.create("pods", pod)
    return created
