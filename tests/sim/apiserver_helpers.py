"""Shared by the API-server emulator tests: manifests, a running emulator with leak checks, Status bodies."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config

from kubesim.apiserver import ApiServerEmulator

Obj = dict[str, Any]
#: `kubernetes` 37 types every model field Optional and every body as a model; the tests read fields the
#: server always sets and send plain dicts, as callers do, so they hold the API untyped.
CoreApi = Any
THREAD_EXIT_S = 2.0


def pod(name: str, namespace: str = "default", **spec: Any) -> Obj:
    labels = spec.pop("labels", None)
    metadata: Obj = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    containers = spec.pop("containers", [{"name": "main", "image": "registry.k8s.io/pause:3.9"}])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": containers, **spec},
    }


def node(name: str, *, ready: bool = True, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "volcano.sh/gpu-number": "2"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "nodeInfo": {
                "machineID": "m-1",
                "systemUUID": "s-1",
                "bootID": "b-1",
                "kernelVersion": "6.1.0",
                "osImage": "Ubuntu 22.04",
                "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads started since `before` that are still alive after a short grace period."""
    deadline = time.monotonic() + THREAD_EXIT_S
    while True:
        alive = [thread for thread in threading.enumerate() if thread not in before and thread.is_alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


@contextmanager
def running_emulator(**options: Any) -> Iterator[ApiServerEmulator]:
    """A started emulator; on exit it is stopped and must have left no thread behind."""
    before = set(threading.enumerate())
    emulator = ApiServerEmulator(**options).start()
    try:
        yield emulator
    finally:
        emulator.stop()
        leaked = new_threads(before)
        assert not leaked, f"threads left after stop(): {[thread.name for thread in leaked]}"


def core_api(kubeconfig: Path) -> CoreApi:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def http(
    emulator: ApiServerEmulator,
    method: str,
    path: str,
    body: Obj | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """A raw request: (code, decoded JSON body or text, headers)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(emulator.url + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            code, raw, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        code, raw, got = error.code, error.read(), dict(error.headers)
    text = raw.decode()
    return code, json.loads(text) if got.get("Content-Type") == "application/json" else text, got


def status_of(error: client.ApiException) -> Obj:
    """The Kubernetes `Status` an ApiException carries."""
    body: Obj = json.loads(error.body or "{}")
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure", body
    assert body["code"] == error.status, body
    return body


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
