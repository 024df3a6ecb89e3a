"""vGPU end to end: the daemon as a subprocess with fake GPUs, pods in the API-server emulator,
admitted by the kubelet emulator on all three vGPU resources over real sockets; node registration
(restored when changed), the handshake as Volcano runs it, and `/metrics`, `/healthz`, `/readyz`
scraped over HTTP."""

from __future__ import annotations

import datetime
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin.fit.codec import decode_node_register
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, GPU1, NODE, TIMEOUT_S, VGPU, Daemon, eventually, inject, streaming
from tests.volcano_handshake import VolcanoHandshake, stamp

NUMBER, MEMORY, CORES = VGPU
PERCENTAGE = "volcano.sh/vgpu-memory-percentage"
REGISTER = "volcano.sh/node-vgpu-register"
HANDSHAKE = "volcano.sh/node-vgpu-handshake"
NODE_PATH = f"/api/v1/nodes/{NODE}"


def launch(
    start: Callable[..., Daemon],
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator | None,
    workdir: Path,
    *args: str,
) -> Daemon:
    """A vGPU daemon with a HAMi-core library in its hook path; waits until kubelet streams."""
    hook = workdir / "hook"
    hook.mkdir()
    (hook / "libvgpu.so").write_bytes(b"HAMi-core stand-in")
    daemon = start(
        "--gpu-strategy",
        "vgpu",
        "--hook-path",
        str(hook),
        "--kubeconfig",
        str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
        *args,
    )
    if kubelet is not None:
        assert kubelet.wait_for(streaming(*VGPU), TIMEOUT_S), daemon.output()
        eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    return daemon


def worker(
    apiserver: ApiServerEmulator,
    name: str,
    memory: int,
    cores: int,
    vgpu_time: int | str,
    *,
    gpu: str = GPU0,
    number: int = 1,
) -> dict[str, Any]:
    """A one-container pod as the scheduler leaves it after a vGPU bind on `gpu` (a UUID) of node-1
    (one device entry, whatever `number` the container limits)."""
    devices = f"{gpu},NVIDIA,{memory},{cores}:"
    limits = {NUMBER: str(number), MEMORY: str(memory)} | ({CORES: str(cores)} if cores else {})
    return apiserver.create(
        "pods",
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "annotations": {
                    "volcano.sh/vgpu-node": NODE,
                    "volcano.sh/vgpu-time": str(vgpu_time),
                    "volcano.sh/vgpu-ids-new": devices,
                    "volcano.sh/devices-to-allocate": devices,
                    "volcano.sh/bind-phase": "allocating",
                    "volcano.sh/bind-time": str(vgpu_time),
                },
            },
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "worker", "image": "cuda", "resources": {"limits": limits}}],
            },
        },
    )


def node_writes(apiserver: ApiServerEmulator) -> int:
    return apiserver.requests.count(method="PATCH", path=NODE_PATH)


def notes(apiserver: ApiServerEmulator, plural: str, name: str) -> dict[str, str]:
    obj = apiserver.get(plural, name, "ml" if plural == "pods" else "") or {}
    return dict(obj.get("metadata", {}).get("annotations") or {})


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def samples(daemon: Daemon, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of metric family `name`, keyed by its sorted labels."""
    status, text = get(daemon.metrics_url() + "/metrics")
    assert status == 200
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_the_documented_vgpu_job(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", "2x10989")
    pods = [worker(apiserver, f"job-worker-{n}", 1024, 0, 1000 + n) for n in range(3)]
    for pod in pods:
        admission = kubelet.admit(pod)
        assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
        envs = admission.allocation("worker", NUMBER).envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == GPU0
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
        assert admission.allocation("worker", MEMORY).envs == {}  # accounting only
        assert all(d.startswith(GPU0) for d in admission.allocation("worker", NUMBER).device_ids)

    def settled(name: str) -> bool:
        return notes(apiserver, "pods", name).get("volcano.sh/bind-phase") == "success"

    eventually(lambda: all(settled(f"job-worker-{n}") for n in range(3)), daemon)
    for n in range(3):
        assert notes(apiserver, "pods", f"job-worker-{n}")["volcano.sh/devices-to-allocate"] == ""


def test_slots_follow_volcanos_container_rule(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """A CPU container first, then cores alone and a percentage alone (no slot: Volcano reads only
    containers limiting vgpu-number or vgpu-memory), memory alone and memory with a percentage
    (one device each, served by the vgpu-memory Allocate, the only one kubelet calls for them),
    number with memory and a percentage, and two devices listed memory-first. The annotations
    are Volcano's bind output: one slot per owner, in container order."""
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", "2x10989")
    containers = {
        "log": {},
        "cores-only": {CORES: "30"},
        "percentage-only": {PERCENTAGE: "50"},
        "memory-only": {MEMORY: "2048", CORES: "25"},
        "memory-percentage": {MEMORY: "1000", PERCENTAGE: "50"},
        "number-memory-percentage": {NUMBER: "1", MEMORY: "1500", PERCENTAGE: "50"},
        "trainer": {MEMORY: "3000", NUMBER: "2"},
    }
    devices = (
        f"{GPU1},NVIDIA,2048,25:;{GPU0},NVIDIA,1000,0:;{GPU1},NVIDIA,1500,0:;"
        f"{GPU0},NVIDIA,3000,0:{GPU1},NVIDIA,3000,0:"
    )
    pod = apiserver.create(
        "pods",
        {
            "metadata": {
                "name": "mixed",
                "namespace": "ml",
                "annotations": {
                    "volcano.sh/vgpu-node": NODE,
                    "volcano.sh/vgpu-time": "1700000000",
                    "volcano.sh/vgpu-ids-new": devices,
                    "volcano.sh/devices-to-allocate": devices,
                    "volcano.sh/bind-phase": "allocating",
                    "volcano.sh/bind-time": "1700000000",
                },
            },
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {"name": name, "image": "cuda", "resources": {"limits": limits}}
                    for name, limits in containers.items()
                ],
            },
        },
    )
    admission = kubelet.admit(pod)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"

    def limits(container: str, resource: str) -> tuple[str, ...]:
        """The GPUs a container sees and its memory limit per GPU."""
        envs = admission.allocation(container, resource).envs
        gpus = envs["NVIDIA_VISIBLE_DEVICES"]
        return (gpus, *(envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(gpus.count(",") + 1)))

    assert limits("memory-only", MEMORY) == (GPU1, "2048m")
    assert admission.allocation("memory-only", MEMORY).envs["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert all(d.startswith(GPU1) for d in admission.allocation("memory-only", MEMORY).device_ids)
    assert limits("memory-percentage", MEMORY) == (GPU0, "1000m")
    assert limits("number-memory-percentage", NUMBER) == (GPU1, "1500m")
    assert limits("trainer", NUMBER) == (f"{GPU0},{GPU1}", "3000m", "3000m")
    for container, resource in [
        ("number-memory-percentage", MEMORY),
        ("trainer", MEMORY),
        ("cores-only", CORES),
        ("memory-only", CORES),
    ]:
        assert admission.allocation(container, resource).envs == {}  # kubelet's accounting only
    assert admission.find("log", NUMBER) is None and admission.find("percentage-only", MEMORY) is None

    eventually(lambda: notes(apiserver, "pods", "mixed").get("volcano.sh/bind-phase") == "success", daemon)
    assert notes(apiserver, "pods", "mixed")["volcano.sh/devices-to-allocate"] == ";;;"
    assert samples(daemon, "volcano_vgpu_device_allocated_memory") == {
        (("NodeName", NODE), ("devID", GPU0)): 4000,
        (("NodeName", NODE), ("devID", GPU1)): 6548,
    }


def test_metrics_follow_the_ledger(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", "1x4914")
    pods = [worker(apiserver, f"small-{n}", 128, 10, 2000 + n) for n in range(5)]
    for pod in pods:
        assert kubelet.admit(pod).admitted, daemon.output()[-3000:]
    device = (("NodeName", NODE), ("devID", GPU0))
    assert samples(daemon, "volcano_vgpu_device_allocated_memory") == {device: 640}
    assert samples(daemon, "volcano_vgpu_device_allocated_cores") == {device: 50}
    assert samples(daemon, "volcano_vgpu_device_shared_number") == {device: 5}
    assert samples(daemon, "volcano_vgpu_device_memory_limit") == {device: 4914}

    def per_pod(metric: str) -> dict[str, float]:
        return {dict(labels)["podName"]: value for labels, value in samples(daemon, metric).items()}

    assert per_pod("volcano_vgpu_device_memory_allocation_for_a_certain_pod") == {
        f"small-{n}": 128 for n in range(5)
    }
    assert per_pod("volcano_vgpu_device_core_allocation_for_a_certain_pod") == {
        f"small-{n}": 10 for n in range(5)
    }
    served = samples(daemon, "volcano_gpu_plugin_allocate_duration_seconds_count")
    assert served[(("outcome", "served"), ("resource", NUMBER))] == 5
    assert served[(("outcome", "empty"), ("resource", MEMORY))] == 5

    for n in (0, 3):  # two pods end
        apiserver.delete("pods", f"small-{n}", "ml")
    eventually(lambda: samples(daemon, "volcano_vgpu_device_shared_number") == {device: 3}, daemon)
    assert samples(daemon, "volcano_vgpu_device_allocated_memory") == {device: 384}
    assert samples(daemon, "volcano_vgpu_device_allocated_cores") == {device: 30}
    assert sorted(per_pod("volcano_vgpu_device_memory_allocation_for_a_certain_pod")) == [
        "small-1",
        "small-2",
        "small-4",
    ]
    # each pod left: its vgpu-number row and the vgpu-memory row that only lets kubelet account
    assert samples(daemon, "volcano_gpu_plugin_ledger_allocations") == {(): 6}
    assert get(daemon.metrics_url() + "/healthz")[0] == 200
    assert get(daemon.metrics_url() + "/readyz") == (200, "ok\n")


def test_metrics_are_in_volcanos_memory_units(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """With a memory factor the gauges hold what Volcano's scheduler exports under the same names:
    the node-vgpu-register memory and the devices-to-allocate memory, not MiB (a dashboard that
    scrapes both sees one value per device, told apart only by the job label)."""
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", "1x4914", "--gpu-memory-factor", "4")
    pods = [worker(apiserver, f"unit-{n}", 128, 10, 3000 + n) for n in range(2)]
    for pod in pods:
        admission = kubelet.admit(pod)
        assert admission.admitted, daemon.output()[-3000:]
        assert admission.allocation("worker", NUMBER).envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "512m"
    eventually(lambda: REGISTER in notes(apiserver, "nodes", NODE), daemon)
    (registered,) = decode_node_register(notes(apiserver, "nodes", NODE)[REGISTER])
    device = (("NodeName", NODE), ("devID", GPU0))
    assert registered.memory == 4914 // 4
    assert samples(daemon, "volcano_vgpu_device_memory_limit") == {device: registered.memory}
    assert samples(daemon, "volcano_vgpu_device_allocated_memory") == {device: 256}
    per_pod = samples(daemon, "volcano_vgpu_device_memory_allocation_for_a_certain_pod")
    assert sorted(per_pod.values()) == [128, 128]


def test_readyz_says_what_is_missing(
    apiserver: ApiServerEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, None, workdir, "--fake-gpus", "1x4914")  # no kubelet here
    status, body = get(daemon.metrics_url() + "/readyz")
    assert (status, body.strip()) == (503, "not registered with kubelet")
    assert get(daemon.metrics_url() + "/healthz") == (200, "ok\n")
    assert get(daemon.metrics_url() + "/nothing")[0] == 404


def test_registration_is_written_once_and_follows_health(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    events = workdir / "events.jsonl"
    daemon = launch(
        start,
        apiserver,
        kubelet,
        workdir,
        "--fake-gpus",
        "2x4914",
        "--fake-gpu-events",
        str(events),
        "--node-resync-interval",
        "0.1",
    )
    eventually(lambda: {REGISTER, HANDSHAKE} <= notes(apiserver, "nodes", NODE).keys(), daemon)
    gpus = decode_node_register(notes(apiserver, "nodes", NODE)[REGISTER])
    assert [(g.uuid, g.split_count, g.memory, g.health, g.mode) for g in gpus] == [
        (GPU0, 10, 4914, True, "hami-core"),
        (GPU1, 10, 4914, True, "hami-core"),
    ]
    assert all(g.type.startswith("NVIDIA-") for g in gpus)
    writes = node_writes(apiserver)
    reads = apiserver.requests.count(method="GET", path=NODE_PATH)
    eventually(lambda: apiserver.requests.count(method="GET", path=NODE_PATH) >= reads + 5, daemon)
    assert node_writes(apiserver) == writes  # five periodic reads of an unchanged node, no write

    inject(events, xid=79, uuid=GPU1)
    eventually(lambda: ",false,hami-core:" in notes(apiserver, "nodes", NODE)[REGISTER], daemon)
    health = [g.health for g in decode_node_register(notes(apiserver, "nodes", NODE)[REGISTER])]
    assert health == [True, False]


def test_a_removed_or_edited_registration_is_restored(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", "2x4914")
    eventually(lambda: REGISTER in notes(apiserver, "nodes", NODE), daemon)
    published = notes(apiserver, "nodes", NODE)[REGISTER]
    for foreign in (None, published.replace(",10,", ",1,")):
        apiserver.patch("nodes", NODE, {"metadata": {"annotations": {REGISTER: foreign}}})
        eventually(lambda: notes(apiserver, "nodes", NODE).get(REGISTER) == published, daemon)
    assert "node annotations changed by someone else, restoring" in daemon.output()


def test_volcano_requests_are_answered_without_a_flag(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    volcano = VolcanoHandshake(apiserver, NODE)  # Volcano v1.8.0 to v1.15.0
    daemon = launch(
        start, apiserver, kubelet, workdir, "--fake-gpus", "1x4914", "--vgpu-handshake-interval", "0.3"
    )
    eventually(lambda: {REGISTER, HANDSHAKE} <= notes(apiserver, "nodes", NODE).keys(), daemon)
    volcano.start()
    try:
        eventually(lambda: volcano.requests >= 3, daemon)
    finally:
        volcano.stop()
    eventually(lambda: notes(apiserver, "nodes", NODE)[HANDSHAKE].startswith("Reported "), daemon)
    daemon.stop()
    # The registration, the seed, and one answer per request: never a second one, never dropped.
    assert node_writes(apiserver) == 2 + volcano.requests
    assert volcano.deleted == 0


@pytest.mark.parametrize("waiting", ["Requesting", "Deleted"])
def test_a_request_found_at_start_is_answered_at_once(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    waiting: str,
) -> None:
    value = stamp(waiting, datetime.datetime.now())
    apiserver.patch("nodes", NODE, {"metadata": {"annotations": {HANDSHAKE: value}}})
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", "1x4914")  # 30 s interval
    eventually(lambda: notes(apiserver, "nodes", NODE)[HANDSHAKE].startswith("Reported "), daemon)


def test_a_garbage_handshake_is_left_alone_and_logged(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    apiserver.patch("nodes", NODE, {"metadata": {"annotations": {HANDSHAKE: "Requesting_soon"}}})
    daemon = launch(
        start, apiserver, kubelet, workdir, "--fake-gpus", "1x4914", "--vgpu-handshake-interval", "0.1"
    )
    eventually(lambda: REGISTER in notes(apiserver, "nodes", NODE), daemon)
    eventually(lambda: "handshake value left alone" in daemon.output(), daemon)
    assert "Requesting_soon" in daemon.output()
    assert notes(apiserver, "nodes", NODE)[HANDSHAKE] == "Requesting_soon"
    assert node_writes(apiserver) == 1  # the registration only


def test_the_heartbeat_for_old_volcano(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(
        start,
        apiserver,
        kubelet,
        workdir,
        "--fake-gpus",
        "1x4914",
        "--vgpu-handshake",
        "true",
        "--vgpu-handshake-interval",
        "0.3",
    )
    eventually(lambda: notes(apiserver, "nodes", NODE).get(HANDSHAKE, "").startswith("Reported "), daemon)
    first = notes(apiserver, "nodes", NODE)[HANDSHAKE]
    eventually(lambda: notes(apiserver, "nodes", NODE)[HANDSHAKE] != first, daemon)  # it keeps beating
