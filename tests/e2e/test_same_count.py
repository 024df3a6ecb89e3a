"""Pods asking the same device count, admitted by kubelet in either order (VGP#93, VGP#138,
VOL#5532): the daemon as a subprocess, pods in the API-server emulator with the annotations the
Volcano scheduler writes, admitted by the kubelet emulator (Go-map resource order, pod-resources
showing the pod under admission) over real sockets.

Where kubelet's records can tell the pods apart at Allocate time each container gets its own
placement; where they cannot (pod-resources refused mid-admission), the swap is detected from
pod-resources afterwards: ledger and scheduler annotations follow what each container got, with
an Event on each pod and a metric."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubesim.admission import Admission
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, GPU1, NODE, TIMEOUT_S, VGPU, Daemon, eventually, streaming
from tests.e2e.test_vgpu import notes, samples, worker

MEM = "volcano.sh/gpu-memory"
NUMBER, MEMORY, _ = VGPU
UUIDS = (GPU0, GPU1)
SWAPPED = "GpuAllocationSwapped"


def launch(
    start: Callable[..., Daemon],
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    workdir: Path,
    *args: str,
) -> Daemon:
    daemon = start(
        "--fake-gpus",
        "2x10989",
        "--kubeconfig",
        str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
        "--reconcile-interval",
        "0.3",
        *args,
    )
    eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    return daemon


def share_pod(
    apiserver: ApiServerEmulator, name: str, gpu: int, predicate_time: int, *, init: bool = False
) -> dict[str, Any]:
    """A 1000 MiB pod as Volcano's gpushare Allocate leaves it: gpu-index and predicate-time (ns);
    `init`: an init container asks as much first."""
    cuda = {"name": "cuda", "image": "cuda", "resources": {"limits": {MEM: "1000"}}}
    return apiserver.create(
        "pods",
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "annotations": {
                    "volcano.sh/gpu-index": str(gpu),
                    "volcano.sh/predicate-time": str(predicate_time),
                },
            },
            "spec": {
                "nodeName": NODE,
                "containers": [cuda],
                "initContainers": [{**cuda, "name": "prepare"}] if init else [],
            },
        },
    )


def vgpu_slot(gpu: int, memory: int) -> str:
    return f"{UUIDS[gpu]},NVIDIA,{memory},0:"


def vgpu_pod(
    apiserver: ApiServerEmulator, name: str, gpu: int, memory: int, vgpu_time: int
) -> dict[str, Any]:
    """One vGPU on `gpu` with `memory` MiB, as Volcano's vGPU bind leaves the pod."""
    return worker(apiserver, name, memory, 0, vgpu_time, gpu=UUIDS[gpu])


def admit(kubelet: KubeletEmulator, pod: dict[str, Any], daemon: Daemon, first: str = "") -> Admission:
    admission = kubelet.admit(pod, resource_order=[first] if first else [])
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    return admission


def swap_events(apiserver: ApiServerEmulator) -> dict[str, str]:
    return {
        event["involvedObject"]["name"]: event["message"]
        for event in apiserver.list("events", "ml")
        if event["reason"] == SWAPPED
    }


def ledger_gpus(workdir: Path, resource: str) -> dict[str, str]:
    """Pod name -> the GPU UUID its live row of `resource` holds."""
    with sqlite3.connect(workdir / "state" / "ledger.db") as db:
        rows = db.execute(
            "SELECT a.pod_name, g.gpu_uuid FROM allocations a JOIN allocation_gpus g"
            " USING (pod_uid, container, resource) WHERE a.state = 'allocated' AND a.resource = ?",
            (resource,),
        ).fetchall()
    return dict(rows)


def counted(daemon: Daemon, metric: str, **labels: str) -> float:
    return samples(daemon, metric).get(tuple(sorted(labels.items())), 0.0)


# --- share mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [("early", "late"), ("late", "early")])
def test_share_pods_of_one_size_each_get_their_own_gpu(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    order: tuple[str, str],
) -> None:
    now = time.time_ns()
    pods = {
        "early": share_pod(apiserver, "early", 0, now),
        "late": share_pod(apiserver, "late", 1, now + 1000),
    }
    daemon = launch(start, apiserver, kubelet, workdir)  # both pending when it starts: one list
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    for name in order:
        entry = admit(kubelet, pods[name], daemon).allocation("cuda", MEM)
        gpu = int(notes(apiserver, "pods", name)["volcano.sh/gpu-index"])
        assert entry.envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[gpu]
        assert all(device.startswith(f"{gpu}-") for device in entry.device_ids)  # kubelet's records agree
    eventually(
        lambda: all(notes(apiserver, "pods", n).get("volcano.sh/gpu-assigned") == "true" for n in pods)
    )
    assert ledger_gpus(workdir, MEM) == {"early": GPU0, "late": GPU1}
    assert [notes(apiserver, "pods", n)["volcano.sh/gpu-index"] for n in ("early", "late")] == ["0", "1"]
    # The second admission had one candidate left; the first had two, told apart by pod-resources.
    assert counted(
        daemon, "volcano_gpu_plugin_allocate_same_count_resolved_total", resource=MEM, signal="pod-resources"
    )
    assert swap_events(apiserver) == {}


def test_share_swap_that_could_not_be_told_apart_is_corrected(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    now = time.time_ns()
    pods = {
        "early": share_pod(apiserver, "early", 0, now),
        "late": share_pod(apiserver, "late", 1, now + 1000),
    }
    daemon = launch(start, apiserver, kubelet, workdir)
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    kubelet.rate_limit_while_admitting = True  # pod-resources cannot be asked at Allocate time
    got = {
        name: admit(kubelet, pods[name], daemon).allocation("cuda", MEM).envs["NVIDIA_VISIBLE_DEVICES"]
        for name in ("late", "early")
    }
    assert got == {"late": GPU0, "early": GPU1}  # swapped: nothing told the pods apart

    def booked(name: str) -> str:
        return notes(apiserver, "pods", name).get("volcano.sh/gpu-index", "")

    eventually(lambda: (booked("early"), booked("late")) == ("1", "0"), daemon)  # what each one has
    assert ledger_gpus(workdir, MEM) == {"early": GPU1, "late": GPU0}
    eventually(lambda: set(swap_events(apiserver)) == {"early", "late"}, daemon)
    assert "volcano.sh/gpu-index=0" in swap_events(apiserver)["late"]
    assert counted(daemon, "volcano_gpu_plugin_allocation_swaps_corrected_total", resource=MEM) == 2
    # Kubelet's pod-resources and the ledger now agree: releasing follows the right pod.
    apiserver.delete("pods", "early", "ml")
    eventually(lambda: ledger_gpus(workdir, MEM) == {"late": GPU0}, daemon)


def test_share_pod_served_as_one_that_never_comes_is_corrected(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """The pod whose placement was taken leaves before kubelet admits it (deleted, or refused by
    another admission check): the row goes to the pod that has it once that is certain."""
    now = time.time_ns()
    pods = {
        "early": share_pod(apiserver, "early", 0, now),
        "late": share_pod(apiserver, "late", 1, now + 1000),
    }
    daemon = launch(start, apiserver, kubelet, workdir)
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    kubelet.rate_limit_while_admitting = True
    assert admit(kubelet, pods["late"], daemon).allocation("cuda", MEM).envs["NVIDIA_VISIBLE_DEVICES"] == GPU0
    assert ledger_gpus(workdir, MEM) == {"early": GPU0}  # while early may still come: left as it is
    apiserver.delete("pods", "early", "ml")
    eventually(lambda: notes(apiserver, "pods", "late").get("volcano.sh/gpu-index") == "0", daemon)
    assert ledger_gpus(workdir, MEM) == {"late": GPU0}
    eventually(lambda: set(swap_events(apiserver)) == {"late"}, daemon)
    assert counted(daemon, "volcano_gpu_plugin_allocation_swaps_corrected_total", resource=MEM) == 1


def test_share_swap_whose_other_pod_left_is_corrected(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Both pods served as each other, then one deleted before any check (here: while the daemon
    was down): nobody holds the other row's devices any more, so the one left gets the row it
    runs on and is booked on its GPU instead of waiting for a cycle that can no longer close."""
    now = time.time_ns()
    pods = {
        "early": share_pod(apiserver, "early", 0, now),
        "late": share_pod(apiserver, "late", 1, now + 1000),
    }
    daemon = launch(start, apiserver, kubelet, workdir, "--reconcile-interval", "3600")
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    kubelet.rate_limit_while_admitting = True
    for name in ("late", "early"):
        admit(kubelet, pods[name], daemon)
    daemon.process.kill()  # no check saw the swap
    daemon.process.wait()
    apiserver.delete("pods", "early", "ml")
    kubelet.release(pods["early"]["metadata"]["uid"])
    daemon = launch(start, apiserver, kubelet, workdir)
    eventually(lambda: notes(apiserver, "pods", "late").get("volcano.sh/gpu-index") == "0", daemon)
    eventually(lambda: ledger_gpus(workdir, MEM) == {"late": GPU0}, daemon)
    assert "late" in swap_events(apiserver)


def test_share_rows_are_released_on_deletion_without_pod_resources(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """No pod-resources socket mounted (as upstream deploys): the rows of pods that could not be
    told apart stay unconfirmed, and with no `List` to confirm them a deletion still releases."""
    now = time.time_ns()
    pods = {
        "early": share_pod(apiserver, "early", 0, now),
        "late": share_pod(apiserver, "late", 1, now + 1000),
    }
    absent = str(workdir / "absent.sock")
    daemon = launch(start, apiserver, kubelet, workdir, "--pod-resources-socket", absent)
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    for name in ("late", "early"):
        admit(kubelet, pods[name], daemon)
    apiserver.delete("pods", "late", "ml")
    eventually(lambda: set(ledger_gpus(workdir, MEM)) == {"early"}, daemon)


def test_share_app_container_on_the_init_containers_devices_is_served(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Kubelet hands a finished init container's devices to the pod's next container: an app
    container asking as many sends the same IDs. It is that container's Allocate, not a repeat:
    the pod is marked assigned and the next pod of that size gets its own GPU."""
    now = time.time_ns()
    staged = share_pod(apiserver, "staged", 0, now, init=True)
    other = share_pod(apiserver, "other", 1, now + 1000)
    daemon = launch(start, apiserver, kubelet, workdir)
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    kubelet.rate_limit_while_admitting = True  # the reuse alone tells the pod
    admission = admit(kubelet, staged, daemon)
    assert admission.allocation("cuda", MEM).device_ids == admission.allocation("prepare", MEM).device_ids
    eventually(lambda: notes(apiserver, "pods", "staged").get("volcano.sh/gpu-assigned") == "true", daemon)
    assert admit(kubelet, other, daemon).allocation("cuda", MEM).envs["NVIDIA_VISIBLE_DEVICES"] == GPU1


# --- vGPU mode -------------------------------------------------------------------------------


def vgpu_daemon(
    start: Callable[..., Daemon], apiserver: ApiServerEmulator, kubelet: KubeletEmulator, workdir: Path
) -> Daemon:
    hook = workdir / "hook"
    hook.mkdir()
    (hook / "libvgpu.so").write_bytes(b"HAMi-core stand-in")
    daemon = launch(start, apiserver, kubelet, workdir, "--gpu-strategy", "vgpu", "--hook-path", str(hook))
    assert kubelet.wait_for(streaming(*VGPU), TIMEOUT_S), daemon.output()
    return daemon


@pytest.mark.parametrize("first", [NUMBER, MEMORY], ids=["number-first", "memory-first"])
@pytest.mark.parametrize("order", [("small", "large"), ("large", "small")])
def test_vgpu_pods_of_one_count_each_get_their_own_gpu_and_memory_limit(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    order: tuple[str, str],
    first: str,
) -> None:
    """Equal `vgpu-number`, different `vgpu-memory`: the upstream plugin hands the first pod kubelet
    admits the earliest `vgpu-time`'s limits."""
    pods = {
        "small": vgpu_pod(apiserver, "small", 0, 2000, 100),
        "large": vgpu_pod(apiserver, "large", 1, 4000, 200),
    }
    wanted = {"small": (GPU0, "2000m"), "large": (GPU1, "4000m")}
    daemon = vgpu_daemon(start, apiserver, kubelet, workdir)
    for name in order:
        admission = admit(kubelet, pods[name], daemon, first)
        envs = admission.allocation("worker", NUMBER).envs
        assert (envs["NVIDIA_VISIBLE_DEVICES"], envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == wanted[name]
        assert all(d.startswith(wanted[name][0]) for d in admission.allocation("worker", NUMBER).device_ids)
    eventually(
        lambda: all(notes(apiserver, "pods", n).get("volcano.sh/bind-phase") == "success" for n in pods)
    )
    assert ledger_gpus(workdir, NUMBER) == {"small": GPU0, "large": GPU1}
    assert notes(apiserver, "pods", "large")["volcano.sh/vgpu-ids-new"] == vgpu_slot(1, 4000)  # untouched
    assert swap_events(apiserver) == {}


def test_vgpu_memory_first_needs_no_pod_resources(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """The `vgpu-memory` Allocate's device count is the container's memory request: once it picked
    the pod, the `vgpu-number` Allocate of the same container follows it through the ledger."""
    pods = {
        "small": vgpu_pod(apiserver, "small", 0, 2000, 100),
        "large": vgpu_pod(apiserver, "large", 1, 4000, 200),
    }
    daemon = vgpu_daemon(start, apiserver, kubelet, workdir)
    kubelet.rate_limit_while_admitting = True
    envs = admit(kubelet, pods["large"], daemon, MEMORY).allocation("worker", NUMBER).envs
    assert (envs["NVIDIA_VISIBLE_DEVICES"], envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (GPU1, "4000m")
    assert counted(
        daemon, "volcano_gpu_plugin_allocate_same_count_resolved_total", resource=NUMBER, signal="ledger"
    )


def test_vgpu_swap_that_could_not_be_told_apart_is_corrected(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """`vgpu-number` first and no pod-resources at Allocate time: nothing tells the pods apart,
    the containers get each other's GPU and limits (as upstream). Afterwards `List` shows who holds
    what: Volcano's `vgpu-ids-new` is rewritten to what each container has."""
    pods = {
        "small": vgpu_pod(apiserver, "small", 0, 2000, 100),
        "large": vgpu_pod(apiserver, "large", 1, 4000, 200),
    }
    daemon = vgpu_daemon(start, apiserver, kubelet, workdir)
    kubelet.rate_limit_while_admitting = True
    got, caches = {}, {}
    for name in ("large", "small"):
        allocation = admit(kubelet, pods[name], daemon, NUMBER).allocation("worker", NUMBER)
        got[name] = (allocation.envs["NVIDIA_VISIBLE_DEVICES"], allocation.envs["CUDA_DEVICE_MEMORY_LIMIT_0"])
        caches[name] = Path(next(m.host_path for m in allocation.mounts if m.container_path == "/tmp/vgpu"))
    assert got == {"large": (GPU0, "2000m"), "small": (GPU1, "4000m")}

    def booked(name: str) -> str:
        return notes(apiserver, "pods", name).get("volcano.sh/vgpu-ids-new", "")

    eventually(lambda: (booked("large"), booked("small")) == (vgpu_slot(0, 2000), vgpu_slot(1, 4000)), daemon)
    assert ledger_gpus(workdir, NUMBER) == {"large": GPU0, "small": GPU1}
    eventually(lambda: set(swap_events(apiserver)) == {"large", "small"}, daemon)
    assert counted(daemon, "volcano_gpu_plugin_allocation_swaps_corrected_total", resource=NUMBER) == 2
    assert all(notes(apiserver, "pods", n)["volcano.sh/bind-phase"] == "success" for n in pods)

    # Each container's HAMi-core cache directory was created under the other pod's UID; deleting
    # that other pod must leave it in place while its container still runs.
    assert all(path.is_dir() for path in caches.values())
    apiserver.delete("pods", "small", "ml")
    eventually(lambda: "small" not in ledger_gpus(workdir, NUMBER), daemon)
    eventually(lambda: not caches["small"].exists(), daemon)
    assert caches["large"].is_dir()
