"""An Allocate rig for in-process tests: the API-server emulator over HTTP, a pod cache, events,
a real ledger on disk, an outbox worker (not started) and the allocator of one strategy."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.api import Kube, load_client
from deviceplugin.kube.events import EventRecorder
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Ledger
from deviceplugin.plugin.allocate import AllocateError, PodAllocator
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout
from deviceplugin.plugin.gpushare import GpushareAllocator
from deviceplugin.plugin.hook import HookPath
from deviceplugin.plugin.outbox import OutboxWorker
from deviceplugin.plugin.vgpu import VgpuAllocator
from kubesim.apiserver import ApiServerEmulator

NODE = "node-a"
MEM, NUM = "volcano.sh/gpu-memory", "volcano.sh/gpu-number"
GPUS = tuple(GpuInfo(index=i, uuid=f"GPU-{i}{i}{i}", model="Fake GPU", memory_mib=10989) for i in range(3))
WAIT_S = 10.0


@dataclass
class Rig:
    apiserver: ApiServerEmulator
    kube: Kube
    pods: PodCache
    ledger: Ledger
    events: EventRecorder
    health: HealthState
    allocator: PodAllocator[Any]
    outbox: OutboxWorker

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create the pod and, when it is bound here, wait until the pod cache holds it."""
        created = self.apiserver.create("pods", pod)
        if pod["spec"].get("nodeName") == NODE:
            uid = created["metadata"]["uid"]
            assert self.pods.wait_until(lambda c: c.get(uid) is not None, WAIT_S)
        return created

    def pod(
        self,
        name: str,
        containers: list[tuple[str, int]],
        *,
        gpu_index: str | None = "0",
        predicate_time: int | None = 1,
        init: list[tuple[str, int]] | None = None,
        node: str = NODE,
        resource: str = MEM,
        extra: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        annotations = dict(extra or {})
        if gpu_index is not None:
            annotations["volcano.sh/gpu-index"] = gpu_index
        if predicate_time is not None:
            annotations["volcano.sh/predicate-time"] = str(predicate_time)

        def spec(items: list[tuple[str, int]]) -> list[dict[str, Any]]:
            return [
                {"name": n, "image": "cuda", "resources": {"limits": {resource: str(u)} if u else {}}}
                for n, u in items
            ]

        pod = {
            "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
            "spec": {"nodeName": node, "containers": spec(containers), "initContainers": spec(init or [])},
        }
        return self.create(pod)

    def events_about(self, name: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = [e for e in self.apiserver.list("events", "") if e["involvedObject"]["name"] == name]
            if found:
                return found
            time.sleep(0.02)
        return []


def ids(gpu: int, start: int, count: int) -> list[str]:
    return [f"{gpu}-{n}" for n in range(start, start + count)]


def envs(response: pb.ContainerAllocateResponse) -> dict[str, str]:
    return dict(response.envs)


def make_rig(
    tmp_path: Path,
    apiserver: ApiServerEmulator,
    strategy: str,
    timeout_s: float = 1.0,
    gpus: Sequence[GpuInfo] = GPUS,
) -> Rig:
    apiserver.create("namespaces", {"metadata": {"name": "ml"}})
    apiserver.create("nodes", {"metadata": {"name": NODE}})
    kube = Kube(load_client(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    pods = PodCache(kube, NODE)
    pods.start()
    assert pods.wait_synced(WAIT_S)
    ledger = Ledger(tmp_path / "ledger.db")
    events = EventRecorder(kube, NODE)
    events.start()
    health = HealthState(tuple(g.uuid for g in gpus))
    devices = DeviceList(RESOURCES[strategy][0], tuple(gpus), Layout(split_count=4))  # type: ignore[index]
    outbox = OutboxWorker(ledger, kube, pods)
    options: dict[str, Any] = {"node_name": NODE, "timeout_s": timeout_s, "on_outbox": outbox.wake}
    allocator: PodAllocator[Any]
    if strategy == "vgpu":
        hook = HookPath(tmp_path / "hook")
        hook.prepare()
        hook.library.write_bytes(b"HAMi-core stand-in")
        allocator = VgpuAllocator(devices, health, pods, ledger, events, hook_path=hook, **options)
    else:
        allocator = GpushareAllocator(devices, health, pods, ledger, events, **options)
    return Rig(apiserver, kube, pods, ledger, events, health, allocator, outbox)


def close_rig(rig: Rig) -> None:
    for part in (rig.outbox, rig.pods, rig.events):
        part.stop()
    rig.ledger.close()


def fails(rig: Rig, device_ids: list[str], code: grpc.StatusCode, *fragments: str) -> AllocateError:
    with pytest.raises(AllocateError) as caught:
        rig.allocator.allocate(device_ids)
    assert caught.value.code == code, str(caught.value)
    for fragment in fragments:
        assert fragment in str(caught.value)
    return caught.value
