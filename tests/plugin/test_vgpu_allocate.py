"""vGPU Allocate (SPEC §3.2) in process against the API-server emulator over HTTP, with a real
ledger, pod cache, events and outbox, and the HAMi-core hook directory on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import objects
from deviceplugin.fit.codec import encode_pod_devices
from deviceplugin.fit.model import Assigned
from deviceplugin.kube.podcache import PodCache
from deviceplugin.plugin.allocate import AccountingAllocator, AllocateError, AllocationStats
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout
from deviceplugin.plugin.release import Releaser
from deviceplugin.plugin.vgpu import VgpuAllocator
from tests.kube.waiting import wait_for
from tests.plugin.rig import GPUS, NODE, WAIT_S, Rig, envs, fails

NUMBER, MEMORY, CORES = "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"
Device = tuple[str, int, int]  # UUID, memory (MiB), cores


def slots(*containers: list[Device]) -> str:
    return encode_pod_devices(
        [[Assigned(uuid, None, "NVIDIA", memory, cores) for uuid, memory, cores in c] for c in containers]
    )


def vpod(
    rig: Rig,
    name: str,
    containers: list[tuple[str, list[Device]]],
    *,
    vgpu_time: int = 1,
    node: str = NODE,
    annotations: dict[str, str] | None = None,
    env: dict[str, list[dict[str, str]]] | None = None,
    cpu_first: bool = False,
) -> dict[str, Any]:
    """A pod as the scheduler leaves it after a vGPU bind: one container per (name, devices),
    each limiting vgpu-number to its device count (and memory to the first device's)."""
    notes = {
        "volcano.sh/vgpu-node": node,
        "volcano.sh/vgpu-time": str(vgpu_time),
        "volcano.sh/devices-to-allocate": slots(*(devices for _, devices in containers)),
        "volcano.sh/vgpu-ids-new": slots(*(devices for _, devices in containers)),
        "volcano.sh/bind-phase": "allocating",
        **(annotations or {}),
    }
    specs: list[dict[str, Any]] = [
        {
            "name": container,
            "image": "cuda",
            "env": (env or {}).get(container, []),
            "resources": {"limits": {NUMBER: str(len(devices)), MEMORY: str(devices[0][1])}},
        }
        for container, devices in containers
    ]
    if cpu_first:
        specs.insert(0, {"name": "log", "image": "busybox"})
    pod = {
        "metadata": {"name": name, "namespace": "ml", "annotations": notes},
        "spec": {"nodeName": NODE, "containers": specs},
    }
    return rig.create(pod)


def notes_of(rig: Rig, name: str) -> dict[str, str]:
    pod = rig.apiserver.get("pods", name, "ml") or {}
    return dict(pod.get("metadata", {}).get("annotations") or {})


def settled(rig: Rig, name: str, phase: str) -> dict[str, str]:
    """Send the outbox and wait until the pod's bind-phase is `phase`; its annotations then."""
    rig.outbox.start()
    wait_for(lambda: notes_of(rig, name).get("volcano.sh/bind-phase") == phase, WAIT_S)
    return notes_of(rig, name)


def mounts(response: pb.ContainerAllocateResponse) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in response.mounts}


# --- the documented job --------------------------------------------------------------------


def test_three_workers_share_gpu_0_with_their_memory_limits(vgpu: Rig) -> None:
    for n in range(3):
        vpod(vgpu, f"worker-{n}", [("cuda", [("GPU-000", 1024, 0)])], vgpu_time=100 + n)
    responses = [vgpu.allocator.allocate([f"GPU-000-{n}"]) for n in range(3)]
    for response in responses:
        assert envs(response)["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"
        assert envs(response)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
        assert envs(response)["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert [a.pod_name for a in vgpu.ledger.active()] == ["worker-0", "worker-1", "worker-2"]
    for n in range(3):
        done = settled(vgpu, f"worker-{n}", "success")
        assert done["volcano.sh/bind-phase"] == "success"
        assert done["volcano.sh/devices-to-allocate"] == ""
        assert done["volcano.sh/vgpu-ids-new"] == "GPU-000,NVIDIA,1024,0:"  # the scheduler's record stays
    # The pass forgets its entries after its last patch has landed, not with it.
    assert wait_for(lambda: vgpu.ledger.outbox_size() == 0, WAIT_S)


def test_the_response_carries_hami_core_mounts_and_a_fresh_cache_dir(vgpu: Rig, tmp_path: Path) -> None:
    pod = vpod(vgpu, "train", [("cuda", [("GPU-111", 2048, 30)])])
    response = vgpu.allocator.allocate(["GPU-111-3"])
    hook = tmp_path / "hook"
    cache = hook / "vgpu" / "containers" / f"{pod['metadata']['uid']}_cuda"
    assert mounts(response) == {
        "/usr/local/vgpu/libvgpu.so": (str(hook / "libvgpu.so"), True),
        "/etc/ld.so.preload": (str(hook / "ld.so.preload"), True),
        "/tmp/vgpu": (str(cache), False),
        "/tmp/vgpulock": (str(hook / "vgpu" / "lock"), False),
    }
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o777
    assert (hook / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert envs(response)["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert envs(response)["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/tmp/vgpu/")
    # Releasing the pod (here: its deletion, as the release loop sees it) removes the directory.
    hook_path = vgpu.allocator.hook  # type: ignore[attr-defined]
    releaser = Releaser(
        vgpu.ledger,
        None,
        tmp_path / "none.sock",
        interval_s=60,
        grace_s=60,
        on_released=lambda _uid: hook_path.keep_mounted(a.response for a in vgpu.ledger.active()),
    )
    releaser.on_pod("DELETED", pod)
    assert not cache.exists()
    assert vgpu.ledger.active() == []


# --- containers ------------------------------------------------------------------------------


def test_a_container_with_two_vgpus(vgpu: Rig) -> None:
    vpod(vgpu, "wide", [("cuda", [("GPU-000", 1000, 50), ("GPU-222", 3000, 50)])])
    response = envs(vgpu.allocator.allocate(["GPU-000-0", "GPU-222-1"]))
    assert response["NVIDIA_VISIBLE_DEVICES"] == "GPU-000,GPU-222"
    assert (response["CUDA_DEVICE_MEMORY_LIMIT_0"], response["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "1000m",
        "3000m",
    )
    assert [(u.index, u.memory, u.cores) for u in vgpu.ledger.usage_by_gpu()] == [
        (0, 1000, 50),
        (2, 3000, 50),
    ]


def test_kubelet_ids_on_some_of_the_scheduled_gpus_are_no_mismatch(vgpu: Rig) -> None:
    """vgpu-number IDs are slots kubelet counts, not the GPUs a container gets: a 2-GPU container's
    two IDs may sit on one of its GPUs (GetPreferredAllocation picks them so). That is no mismatch:
    no GpuIdsMismatch Event or count; IDs on a GPU the scheduler did not choose are one."""
    vpod(vgpu, "wide", [("cuda", [("GPU-000", 1000, 0), ("GPU-222", 1000, 0)])], vgpu_time=1)
    vpod(vgpu, "elsewhere", [("cuda", [("GPU-000", 1000, 0)])], vgpu_time=2)
    wide = envs(vgpu.allocator.allocate(["GPU-000-0", "GPU-000-1"]))
    assert wide["NVIDIA_VISIBLE_DEVICES"] == "GPU-000,GPU-222"
    assert vgpu.allocator.stats.mismatches[NUMBER] == 0
    elsewhere = envs(vgpu.allocator.allocate(["GPU-111-0"]))  # the control: a GPU it was not given
    assert elsewhere["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"
    assert vgpu.allocator.stats.mismatches[NUMBER] == 1
    assert [e["reason"] for e in vgpu.events_about("elsewhere")] == ["GpuIdsMismatch"]
    # Events are posted in order: once the control's is in, one about "wide" would be too.
    assert [e["involvedObject"]["name"] for e in vgpu.apiserver.list("events", "ml")] == ["elsewhere"]


def test_two_gpu_containers_after_a_cpu_container_each_get_their_own_slot(vgpu: Rig) -> None:
    vpod(
        vgpu,
        "pair",
        [("trainer", [("GPU-000", 512, 0)]), ("evaluator", [("GPU-111", 256, 0)])],
        cpu_first=True,
    )
    first = envs(vgpu.allocator.allocate(["GPU-000-0"]))
    assert (first["NVIDIA_VISIBLE_DEVICES"], first["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("GPU-000", "512m")
    vgpu.outbox.run_once()
    after_first = notes_of(vgpu, "pair")
    assert after_first["volcano.sh/devices-to-allocate"] == ";GPU-111,NVIDIA,256,0:"
    assert after_first["volcano.sh/bind-phase"] == "allocating"  # one GPU container still to come
    second = envs(vgpu.allocator.allocate(["GPU-111-0"]))
    assert (second["NVIDIA_VISIBLE_DEVICES"], second["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("GPU-111", "256m")
    done = settled(vgpu, "pair", "success")
    assert done["volcano.sh/devices-to-allocate"] == ";"
    assert sorted(a.container for a in vgpu.ledger.active()) == ["evaluator", "trainer"]


def test_cuda_disable_control_skips_the_preload_only(vgpu: Rig) -> None:
    vpod(
        vgpu,
        "free",
        [("cuda", [("GPU-000", 100, 0)])],
        env={"cuda": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]},
    )
    paths = mounts(vgpu.allocator.allocate(["GPU-000-0"]))
    assert "/etc/ld.so.preload" not in paths
    assert "/usr/local/vgpu/libvgpu.so" in paths


@pytest.mark.parametrize("ahead", [True, False], ids=["built-as-the-pod-came", "built-at-allocate"])
def test_the_response_bytes_name_each_env_and_mount_in_hami_cores_order(
    vgpu: Rig, tmp_path: Path, ahead: bool
) -> None:
    """Byte for byte (the ledger keeps these bytes, a repeat answers them), whether the response
    was built as the pod came or (its pod cached before the allocator started) at Allocate: the
    container's env in order, then the node's (an oversubscribing layout, the core limit
    disabled); the library, cache, lock and preload mounts in that order; no preload for a
    CUDA_DISABLE_CONTROL one."""

    def allocator() -> VgpuAllocator:
        return VgpuAllocator(
            DeviceList(RESOURCES["vgpu"][0], GPUS, Layout(split_count=4, memory_scaling=2.0)),
            vgpu.health,
            vgpu.pods,
            vgpu.ledger,
            vgpu.events,
            hook_path=vgpu.allocator.hook,  # type: ignore[attr-defined]
            disable_core_limit=True,
            node_name=NODE,
            timeout_s=1.0,
        )

    number = allocator() if ahead else None
    env = {"free": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}
    pod = vpod(
        vgpu,
        "exact",
        [("cuda", [("GPU-000", 1000, 50), ("GPU-222", 3000, 50)]), ("free", [("GPU-111", 100, 20)])],
        env=env,
    )
    number = number or allocator()
    uid, hook = pod["metadata"]["uid"], tmp_path / "hook"

    def expected(container: str, envs: dict[str, str], preload: bool) -> bytes:
        mounts = [
            pb.Mount(
                container_path="/usr/local/vgpu/libvgpu.so", host_path=f"{hook}/libvgpu.so", read_only=True
            ),
            pb.Mount(container_path="/tmp/vgpu", host_path=f"{hook}/vgpu/containers/{uid}_{container}"),
            pb.Mount(container_path="/tmp/vgpulock", host_path=f"{hook}/vgpu/lock"),
        ]
        if preload:
            mounts.append(
                pb.Mount(
                    container_path="/etc/ld.so.preload", host_path=f"{hook}/ld.so.preload", read_only=True
                )
            )
        node = {"CUDA_OVERSUBSCRIBE": "true", "GPU_CORE_UTILIZATION_POLICY": "disable"}
        return pb.ContainerAllocateResponse(envs={**envs, **node}, mounts=mounts).SerializeToString()

    cache = f"/tmp/vgpu/{uid}.cache"
    first = number.allocate(["GPU-000-0", "GPU-222-0"]).SerializeToString()
    assert first == expected(
        "cuda",
        {
            "NVIDIA_VISIBLE_DEVICES": "GPU-000,GPU-222",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m",
            "CUDA_DEVICE_SM_LIMIT": "50",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache,
        },
        preload=True,
    )
    second = number.allocate(["GPU-111-0"]).SerializeToString()
    assert second == expected(
        "free",
        {
            "NVIDIA_VISIBLE_DEVICES": "GPU-111",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "100m",
            "CUDA_DEVICE_SM_LIMIT": "20",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache,
        },
        preload=False,
    )
    assert [row.response for row in vgpu.ledger.active()] == [first, second]


def test_a_pod_placed_anew_before_its_allocate_gets_its_new_gpu(vgpu: Rig) -> None:
    """What was made for the pod as it came is not what its Allocate hands out once the
    scheduler's annotations changed."""
    vpod(vgpu, "moved", [("cuda", [("GPU-000", 100, 0)])])
    anew = slots([("GPU-111", 200, 10)])
    notes = {"volcano.sh/devices-to-allocate": anew, "volcano.sh/vgpu-ids-new": anew}
    vgpu.apiserver.patch("pods", "moved", {"metadata": {"annotations": notes}}, "ml")
    assert vgpu.pods.wait_until(  # its listeners have run
        lambda cache: objects.annotations_of(cache.pods()[0]).get("volcano.sh/devices-to-allocate") == anew,
        WAIT_S,
    )
    response = envs(vgpu.allocator.allocate(["GPU-111-0"]))
    assert (response["NVIDIA_VISIBLE_DEVICES"], response["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("GPU-111", "200m")


def test_a_pods_cache_directory_is_made_as_it_comes_and_goes_with_it_unserved(
    vgpu: Rig, tmp_path: Path
) -> None:
    """Off the Allocate path: the directory is there, empty and shared, once the pod cache holds
    the pod; its Allocate mounts that very directory; a pod deleted before its Allocate leaves
    none behind."""
    containers = tmp_path / "hook" / "vgpu" / "containers"
    served = vpod(vgpu, "served", [("cuda", [("GPU-000", 100, 0)])])
    made = containers / f"{served['metadata']['uid']}_cuda"
    assert made.is_dir() and list(made.iterdir()) == [] and made.stat().st_mode & 0o777 == 0o777
    inode = made.stat().st_ino
    assert mounts(vgpu.allocator.allocate(["GPU-000-0"]))["/tmp/vgpu"] == (str(made), False)
    assert made.stat().st_ino == inode
    gone = vpod(vgpu, "gone", [("cuda", [("GPU-111", 100, 0)])])
    dropped = containers / f"{gone['metadata']['uid']}_cuda"
    assert dropped.is_dir()
    vgpu.apiserver.delete("pods", "gone", "ml")
    assert wait_for(lambda: not dropped.exists(), WAIT_S)
    assert sorted(p.name for p in containers.iterdir()) == [made.name]


def test_pods_are_served_in_bind_order_not_by_vgpu_time(vgpu: Rig) -> None:
    """Kubelet admits pods in the order their binding reaches it (the daemon's watch sees the same
    order); Volcano's `vgpu-time` is stamped before an asynchronous bind."""
    vpod(vgpu, "bound-first", [("cuda", [("GPU-111", 100, 0)])], vgpu_time=200)
    vpod(vgpu, "bound-second", [("cuda", [("GPU-222", 100, 0)])], vgpu_time=100)
    assert envs(vgpu.allocator.allocate(["GPU-111-0"]))["NVIDIA_VISIBLE_DEVICES"] == "GPU-111"
    assert [a.pod_name for a in vgpu.ledger.active()] == ["bound-first"]


def test_a_repeated_allocate_returns_the_same_bytes(vgpu: Rig) -> None:
    vpod(vgpu, "once", [("cuda", [("GPU-000", 100, 0)])])
    first = vgpu.allocator.allocate(["GPU-000-2"])
    assert vgpu.allocator.allocate(["GPU-000-2"]) == first
    assert len(vgpu.ledger.active()) == 1


def test_preferred_steers_vgpu_number_ids_onto_the_assigned_gpu(vgpu: Rig) -> None:
    vpod(vgpu, "steer", [("cuda", [("GPU-222", 100, 0)])])
    available = [f"{gpu.uuid}-{n}" for gpu in GPUS for n in range(4)]
    request = pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)
    assert vgpu.allocator.preferred(request) == ["GPU-222-0"]


# --- refusals ------------------------------------------------------------------------------------


def refused(rig: Rig, name: str, device_ids: list[str], code: grpc.StatusCode, *fragments: str) -> None:
    """The Allocate fails with every fragment in its message, the pod ends bind-phase failed and
    an Event names the reason."""
    fails(rig, device_ids, code, f"ml/{name}", *fragments)
    assert settled(rig, name, "failed")["volcano.sh/bind-phase"] == "failed"
    assert any(e["reason"] == "GpuAllocationFailed" for e in rig.events_about(name))
    assert rig.ledger.active() == []


def test_undecodable_devices_to_allocate(vgpu: Rig) -> None:
    vpod(
        vgpu,
        "garbled",
        [("cuda", [("GPU-000", 100, 0)])],
        annotations={"volcano.sh/devices-to-allocate": "GPU-000,NVIDIA,lots,0:"},
    )
    refused(vgpu, "garbled", ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "devices-to-allocate", "lots")


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"volcano.sh/vgpu-time": "9" * 4301}, "vgpu-time has 4301 digits; a Unix time in seconds"),
        (
            {"volcano.sh/devices-to-allocate": f"GPU-000,NVIDIA,{'9' * 5000},0:"},
            "memory has 5000 digits; an int64 has at most 19",
        ),
    ],
    ids=["vgpu-time", "devices-to-allocate"],
)
def test_numbers_longer_than_volcano_writes_cost_only_their_pod(
    vgpu: Rig, annotations: dict[str, str], fragment: str
) -> None:
    """Issue 13 F1: past what int() converts; the pod is refused in its turn with the reason,
    and the pod bound after it is still served."""
    poison = vpod(vgpu, "poison", [("cuda", [("GPU-000", 100, 0)])], annotations=annotations)
    vpod(vgpu, "next", [("cuda", [("GPU-111", 100, 0)])])
    error = fails(vgpu, ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "ml/poison", fragment)
    assert len(str(error)) < 600  # the annotation is clipped, not copied into the error and Event
    vgpu.outbox.start()  # its `bind-phase: failed` reaches the API server and the pod cache

    def failed(cache: PodCache) -> bool:
        notes = objects.annotations_of(cache.get(poison["metadata"]["uid"]) or {"metadata": {}})
        return notes.get("volcano.sh/bind-phase") == "failed"

    assert vgpu.pods.wait_until(failed, WAIT_S)
    assert envs(vgpu.allocator.allocate(["GPU-111-0"]))["NVIDIA_VISIBLE_DEVICES"] == "GPU-111"


def test_count_mismatch(vgpu: Rig) -> None:
    pod = vpod(
        vgpu,
        "short",
        [("cuda", [("GPU-000", 100, 0), ("GPU-111", 100, 0)])],
        annotations={"volcano.sh/devices-to-allocate": slots([("GPU-000", 100, 0)])},
    )
    assert pod["spec"]["containers"][0]["resources"]["limits"][NUMBER] == "2"
    refused(
        vgpu,
        "short",
        ["GPU-000-0", "GPU-111-0"],
        grpc.StatusCode.INVALID_ARGUMENT,
        "asks for 2",
        "gives it 1 device",
    )


def test_vgpu_node_naming_another_node(vgpu: Rig) -> None:
    vpod(vgpu, "lost", [("cuda", [("GPU-000", 100, 0)])], node="node-b")
    refused(vgpu, "lost", ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "volcano.sh/vgpu-node is 'node-b'")


def test_a_mode_the_node_does_not_run(vgpu: Rig) -> None:
    vpod(vgpu, "mig", [("cuda", [("GPU-000", 100, 0)])], annotations={"volcano.sh/vgpu-mode": "mig"})
    refused(vgpu, "mig", ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "vgpu-mode 'mig'", "hami-core only")


def test_a_gpu_the_node_does_not_have(vgpu: Rig) -> None:
    vpod(vgpu, "elsewhere", [("cuda", [("GPU-999", 100, 0)])])
    refused(vgpu, "elsewhere", ["GPU-000-0"], grpc.StatusCode.FAILED_PRECONDITION, "GPU-999", "does not have")


def test_an_unhealthy_gpu(vgpu: Rig) -> None:
    vgpu.health.set(("GPU-111",), healthy=False, reason="Xid 79")
    vpod(vgpu, "sick", [("cuda", [("GPU-111", 100, 0)])])
    refused(vgpu, "sick", ["GPU-000-0"], grpc.StatusCode.FAILED_PRECONDITION, "GPU 1 (GPU-111)", "unhealthy")


def test_missing_hami_core_library(vgpu: Rig, tmp_path: Path) -> None:
    (tmp_path / "hook" / "libvgpu.so").unlink()
    vpod(vgpu, "nolib", [("cuda", [("GPU-000", 100, 0)])])
    refused(vgpu, "nolib", ["GPU-000-0"], grpc.StatusCode.FAILED_PRECONDITION, "libvgpu.so", "--hook-path")


def test_a_pod_placed_without_a_vgpu_scheduler_is_explained(vgpu: Rig) -> None:
    vgpu.create(
        {
            "metadata": {"name": "plain", "namespace": "ml"},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": {NUMBER: "1"}}}],
            },
        }
    )
    fails(vgpu, ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "ml/plain", "no volcano.sh/vgpu-node")


def test_a_problem_pod_fails_on_its_own_turn_and_the_next_pod_gets_its_own_slot(vgpu: Rig) -> None:
    """Kubelet admits the pod bound first even when it cannot be served: its Allocate is the one
    that fails, and the servable pod is not handed to it."""
    broken = vpod(vgpu, "broken", [("cuda", [("GPU-000", 100, 0)])], vgpu_time=1, node="node-b")
    vpod(vgpu, "fine", [("cuda", [("GPU-111", 100, 0)])], vgpu_time=2)
    fails(vgpu, ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "ml/broken")
    vgpu.outbox.start()  # its `bind-phase: failed` reaches the API server and the pod cache

    def failed(cache: PodCache) -> bool:
        notes = objects.annotations_of(cache.get(broken["metadata"]["uid"]) or {"metadata": {}})
        return notes.get("volcano.sh/bind-phase") == "failed"

    assert vgpu.pods.wait_until(failed, WAIT_S)
    assert envs(vgpu.allocator.allocate(["GPU-111-0"]))["NVIDIA_VISIBLE_DEVICES"] == "GPU-111"


def test_settled_and_finished_pods_are_not_candidates(vgpu: Rig) -> None:
    vpod(vgpu, "done", [("cuda", [("GPU-000", 100, 0)])], annotations={"volcano.sh/bind-phase": "success"})
    vpod(vgpu, "gave-up", [("cuda", [("GPU-000", 100, 0)])], annotations={"volcano.sh/bind-phase": "failed"})
    fails(vgpu, ["GPU-000-0"], grpc.StatusCode.FAILED_PRECONDITION, "no pod bound here")


# --- Volcano's container rule: which container owns which slot ------------------------------

GPU0, GPU1, GPU2 = (gpu.uuid for gpu in GPUS)
PERCENTAGE = "volcano.sh/vgpu-memory-percentage"


def placed(
    rig: Rig,
    name: str,
    containers: list[tuple[str, dict[str, str]]],
    devices: str,
    *,
    vgpu_time: int = 1,
    init: list[tuple[str, dict[str, str]]] | None = None,
    phase: str = "allocating",
) -> dict[str, Any]:
    """A pod with these limits per container and `devices` as Volcano's bind writes it (one
    `;`-separated slot per container that owns one)."""

    def spec(items: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
        return [{"name": n, "image": "cuda", "resources": {"limits": limits}} for n, limits in items]

    notes = {
        "volcano.sh/vgpu-node": NODE,
        "volcano.sh/vgpu-time": str(vgpu_time),
        "volcano.sh/vgpu-ids-new": devices,
        "volcano.sh/devices-to-allocate": devices,
        "volcano.sh/bind-phase": phase,
        "volcano.sh/bind-time": str(vgpu_time),
    }
    pod = {
        "metadata": {"name": name, "namespace": "ml", "annotations": notes},
        "spec": {"nodeName": NODE, "containers": spec(containers), "initContainers": spec(init or [])},
    }
    return rig.create(pod)


@pytest.fixture
def memory(vgpu: Rig) -> VgpuAllocator:
    """The node's vgpu-memory allocator beside the rig's vgpu-number one (same cache, ledger, hook)."""
    number = vgpu.allocator
    assert isinstance(number, VgpuAllocator)
    devices = DeviceList(RESOURCES["vgpu"][1], GPUS, Layout(split_count=4))
    return VgpuAllocator(
        devices,
        vgpu.health,
        vgpu.pods,
        vgpu.ledger,
        vgpu.events,
        hook_path=number.hook,
        node_name=NODE,
        timeout_s=1.0,
        on_outbox=vgpu.outbox.wake,
    )


def memory_ids(gpu: str, count: int, start: int = 0) -> list[str]:
    return [f"{gpu}-memory-{n}" for n in range(start, start + count)]


def test_only_containers_limiting_number_or_memory_own_slots(vgpu: Rig) -> None:
    """Cores alone, a percentage alone and no GPU at all own no slot; a percentage beside memory is
    Volcano's to resolve (the slot carries the result), so the pod is served as placed."""
    placed(
        vgpu,
        "mixed",
        [
            ("log", {}),
            ("cores-only", {CORES: "30"}),
            ("percentage-only", {PERCENTAGE: "50"}),
            ("both", {NUMBER: "1", MEMORY: "1000", PERCENTAGE: "50", CORES: "20"}),
            ("wide", {NUMBER: "2"}),
        ],
        f"{GPU1},NVIDIA,5494,20:;{GPU0},NVIDIA,10989,0:{GPU2},NVIDIA,10989,0:",
    )
    both = envs(vgpu.allocator.allocate([f"{GPU0}-0"]))
    assert (both["NVIDIA_VISIBLE_DEVICES"], both["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (GPU1, "5494m")
    assert both["CUDA_DEVICE_SM_LIMIT"] == "20"
    wide = envs(vgpu.allocator.allocate([f"{GPU0}-1", f"{GPU2}-1"]))
    assert wide["NVIDIA_VISIBLE_DEVICES"] == f"{GPU0},{GPU2}"
    done = settled(vgpu, "mixed", "success")
    assert done["volcano.sh/devices-to-allocate"] == ";"
    assert sorted(a.container for a in vgpu.ledger.active()) == ["both", "wide"]


def test_a_memory_only_container_is_served_by_the_vgpu_memory_allocate(
    vgpu: Rig, memory: VgpuAllocator, tmp_path: Path
) -> None:
    """Kubelet never calls the number plugin for it; Volcano gave it one device."""
    pod = placed(vgpu, "small", [("cuda", {MEMORY: "2048", CORES: "25"})], f"{GPU2},NVIDIA,2048,25:")
    response = memory.allocate(memory_ids(GPU2, 2048))
    assert envs(response)["NVIDIA_VISIBLE_DEVICES"] == GPU2
    assert envs(response)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert envs(response)["CUDA_DEVICE_SM_LIMIT"] == "25"
    cache = tmp_path / "hook" / "vgpu" / "containers" / f"{pod['metadata']['uid']}_cuda"
    assert mounts(response)["/tmp/vgpu"] == (str(cache), False)
    assert "/etc/ld.so.preload" in mounts(response)
    assert [(u.index, u.memory, u.cores) for u in vgpu.ledger.usage_by_gpu()] == [(2, 2048, 25)]
    done = settled(vgpu, "small", "success")
    assert done["volcano.sh/devices-to-allocate"] == ""


def test_preferred_steers_memory_ids_of_a_memory_only_container(vgpu: Rig, memory: VgpuAllocator) -> None:
    placed(vgpu, "steer", [("cuda", {MEMORY: "3"})], f"{GPU1},NVIDIA,3,0:")
    available = [device for gpu in GPUS for device in memory_ids(gpu.uuid, 4)]
    request = pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=3)
    assert memory.preferred(request) == memory_ids(GPU1, 3)


def test_a_pod_with_a_number_and_a_memory_only_container_settles_after_both(
    vgpu: Rig, memory: VgpuAllocator
) -> None:
    placed(
        vgpu,
        "pair",
        [("trainer", {NUMBER: "1", MEMORY: "512"}), ("sidecar", {MEMORY: "256"})],
        f"{GPU0},NVIDIA,512,0:;{GPU1},NVIDIA,256,0:",
    )
    trainer = envs(vgpu.allocator.allocate([f"{GPU0}-0"]))
    assert memory.allocate(memory_ids(GPU0, 512)) == pb.ContainerAllocateResponse()  # trainer's accounting
    vgpu.outbox.run_once()
    assert notes_of(vgpu, "pair")["volcano.sh/bind-phase"] == "allocating"  # the sidecar's slot is left
    sidecar = envs(memory.allocate(memory_ids(GPU1, 256)))
    assert (trainer["NVIDIA_VISIBLE_DEVICES"], sidecar["NVIDIA_VISIBLE_DEVICES"]) == (GPU0, GPU1)
    assert sidecar["CUDA_DEVICE_MEMORY_LIMIT_0"] == "256m"
    assert settled(vgpu, "pair", "success")["volcano.sh/devices-to-allocate"] == ";"
    assert [(u.index, u.memory) for u in vgpu.ledger.usage_by_gpu()] == [(0, 512), (1, 256)]


@pytest.mark.parametrize("memory_first", [True, False])
def test_vgpu_memory_of_a_number_container_only_accounts_in_either_order(
    vgpu: Rig, memory: VgpuAllocator, memory_first: bool
) -> None:
    """Kubelet calls a container's plugins in map order; the memory call of a number container
    gets an empty answer before or after the number call settled the pod."""
    placed(vgpu, "one", [("cuda", {NUMBER: "1", MEMORY: "1024"})], f"{GPU0},NVIDIA,1024,0:")
    if memory_first:
        assert memory.allocate(memory_ids(GPU0, 1024)) == pb.ContainerAllocateResponse()
    served = envs(vgpu.allocator.allocate([f"{GPU0}-0"]))
    assert served["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    settled(vgpu, "one", "success")
    pod_uid = vgpu.ledger.active()[0].pod_uid

    def cached_phase(cache: PodCache) -> str:
        return str(objects.annotations_of(cache.get(pod_uid) or {}).get("volcano.sh/bind-phase"))

    assert vgpu.pods.wait_until(lambda cache: cached_phase(cache) == "success", WAIT_S)
    if not memory_first:
        assert memory.allocate(memory_ids(GPU0, 1024)) == pb.ContainerAllocateResponse()
    assert [(u.index, u.memory) for u in vgpu.ledger.usage_by_gpu()] == [(0, 1024)]
    assert {a.resource for a in vgpu.ledger.active()} == {NUMBER, MEMORY}


def test_a_pod_settled_elsewhere_never_takes_a_memory_only_containers_turn(
    vgpu: Rig, memory: VgpuAllocator
) -> None:
    """A running pod whose slots another plugin served (nothing in this ledger) ranks first by
    vgpu-time and asks as much memory, yet the later memory-only container gets its GPU."""
    placed(vgpu, "old", [("cuda", {NUMBER: "1", MEMORY: "700"})], "", vgpu_time=1, phase="success")
    placed(vgpu, "new", [("cuda", {MEMORY: "700"})], f"{GPU2},NVIDIA,700,0:", vgpu_time=2)
    assert envs(memory.allocate(memory_ids(GPU2, 700)))["NVIDIA_VISIBLE_DEVICES"] == GPU2
    assert [a.pod_name for a in vgpu.ledger.active()] == ["new"]


def test_an_init_container_asking_vgpu_memory_is_refused(vgpu: Rig, memory: VgpuAllocator) -> None:
    """Volcano writes no slot and books nothing for init containers: no limits to give it."""
    placed(
        vgpu,
        "setup",
        [("cuda", {NUMBER: "1"})],
        f"{GPU0},NVIDIA,10989,0:",
        init=[("prepare", {MEMORY: "100"})],
    )
    with pytest.raises(AllocateError) as caught:
        memory.allocate(memory_ids(GPU0, 100))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "init container 'prepare': vGPU is served to app containers only" in str(caught.value)
    assert settled(vgpu, "setup", "failed")["volcano.sh/bind-phase"] == "failed"


def test_a_slot_count_that_is_not_volcanos_is_refused(vgpu: Rig) -> None:
    """Two containers own slots by Volcano's rule (number, memory alone) but the annotation has
    one: any mapping would be a guess."""
    placed(
        vgpu,
        "odd",
        [("a", {NUMBER: "1"}), ("b", {MEMORY: "100"})],
        f"{GPU0},NVIDIA,100,0:",
    )
    refused(
        vgpu,
        "odd",
        [f"{GPU0}-0"],
        grpc.StatusCode.INVALID_ARGUMENT,
        "1 container slot(s); 2 container(s) limit volcano.sh/vgpu-number or volcano.sh/vgpu-memory (a, b)",
    )


# --- the accounting resources ----------------------------------------------------------------


def test_cores_answer_empty_responses() -> None:
    stats = AllocationStats()
    allocator = AccountingAllocator(DeviceList(RESOURCES["vgpu"][2], GPUS, Layout()), stats)
    assert allocator.allocate(["GPU-222-core-99"]) == pb.ContainerAllocateResponse()
    with pytest.raises(Exception, match="not devices of this node"):
        allocator.allocate(["GPU-X222-core-99"])
    assert stats.outcomes[(CORES, "empty")] == 1 and stats.failures["unknown-devices"] == 1


def test_vgpu_allocator_is_the_number_resource(vgpu: Rig) -> None:
    assert isinstance(vgpu.allocator, VgpuAllocator)
    assert vgpu.allocator.resource == NUMBER
