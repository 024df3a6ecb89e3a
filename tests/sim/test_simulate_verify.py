"""The check of what each container received (issue 19 item 2), rule by rule, on kubelet's admission
records as the kubelet emulator keeps them: a response that differs from the scheduler's choice or
the request in any one value is a failure naming the pod, the container and the values, and a
faithful one passes. (The whole flow, where every response comes from the real daemon, is in
test_simulate.py and test_simulate_examples.py; no correct component produces these mismatches.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.api import deviceplugin_pb2 as dp
from kubesim.admission import Admission, ContainerAllocation, PodSpec
from kubesim.nodes import NodeSpec
from kubesim.scratch import scratch_dir
from kubesim.verify import own_scheduler_annotations, received, verify

SHARE = NodeSpec("gpu-share-1", "share", 2, 10989)
NUMBER = NodeSpec("gpu-number-1", "number", 4, 16384)
VGPU = NodeSpec("gpu-vgpu-1", "vgpu", 2, 16384, mode="hami-core")
MPS = NodeSpec("gpu-mps-1", "vgpu", 2, 23028, "NVIDIA A10", mode="mps")
GPU_NUMBER = "volcano.sh/gpu-number"
#: One Allocate response kubelet recorded: container, resource, envs, mounts.
Response = tuple[str, str, dict[str, str], list[dp.Mount]]
GIVES = "the scheduler's volcano.sh/gpu-index gives it"
LIBRARY = dp.Mount(container_path="/usr/local/vgpu/libvgpu.so", host_path="/h/libvgpu.so", read_only=True)


def uuid(node: NodeSpec, index: int) -> str:
    return node.gpus[index].uuid


def pod(
    containers: dict[str, dict[str, str]], annotations: dict[str, str], init: tuple[str, ...] = ()
) -> Any:
    def container(name: str) -> dict[str, Any]:
        return {"name": name, "image": "cuda", "resources": {"limits": containers[name]}}

    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "annotations": annotations},
        "spec": {
            "initContainers": [container(name) for name in init],
            "containers": [container(name) for name in containers if name not in init],
        },
    }


def admitted(the_pod: Any, *responses: Response) -> Admission:
    allocations = tuple(
        ContainerAllocation(name, resource, (), {}, dp.ContainerAllocateResponse(envs=envs, mounts=mounts))
        for name, resource, envs, mounts in responses
    )
    return Admission(PodSpec.from_json(the_pod), admitted=True, allocations=allocations)


def problems(the_pod: Any, node: NodeSpec, *responses: Response) -> list[str]:
    views, conflicts = received(the_pod, admitted(the_pod, *responses))
    return conflicts + verify(the_pod, views, node)


def share_env(index: int, allocated: str = "1024") -> dict[str, str]:
    total = str(SHARE.memory_mib)
    return {
        "NVIDIA_VISIBLE_DEVICES": uuid(SHARE, index),
        "VOLCANO_GPU_ALLOCATED": allocated,
        "VOLCANO_GPU_MEMORY_TOTAL": total,
        "VOLCANO_GPU_TOTAL": total,
    }


SHARE_POD = pod(
    {"c": {"volcano.sh/gpu-memory": "1024"}}, {"volcano.sh/gpu-index": "1", "volcano.sh/gpu-assigned": "true"}
)


def test_share_container_given_the_scheduler_s_gpu_passes() -> None:
    assert problems(SHARE_POD, SHARE, ("c", "volcano.sh/gpu-memory", share_env(1), [])) == []


@pytest.mark.parametrize(
    ("envs", "wrong"),
    [
        (
            share_env(0),
            "ns/p container c: NVIDIA_VISIBLE_DEVICES names GPU(s) 0; the scheduler's volcano.sh/gpu-index "
            "gives it 1",
        ),
        (
            share_env(1, "2048"),
            "ns/p container c: VOLCANO_GPU_ALLOCATED='2048', wanted '1024' (asks volcano.sh/gpu-memory=1024)",
        ),
        (
            share_env(1) | {"VOLCANO_GPU_MEMORY_TOTAL": "16384"},
            "VOLCANO_GPU_MEMORY_TOTAL='16384', wanted '10989'",
        ),
        (
            share_env(1) | {"NVIDIA_VISIBLE_DEVICES": "GPU-elsewhere"},
            "NVIDIA_VISIBLE_DEVICES=GPU-elsewhere names 'GPU-elsewhere', which is no GPU of its node",
        ),
    ],
    ids=["other-gpu", "allocated", "total", "foreign-uuid"],
)
def test_share_container_given_anything_else_fails(envs: dict[str, str], wrong: str) -> None:
    (problem,) = problems(SHARE_POD, SHARE, ("c", "volcano.sh/gpu-memory", envs, []))
    assert wrong in problem


def test_number_containers_take_consecutive_slices_of_gpu_index() -> None:
    limits = {"a": {"volcano.sh/gpu-number": "1"}, "b": {"volcano.sh/gpu-number": "2"}}
    the_pod = pod(limits, {"volcano.sh/gpu-index": "3,0,2", "volcano.sh/gpu-assigned": "true"})

    def envs(*indices: int) -> dict[str, str]:
        visible = ",".join(uuid(NUMBER, i) for i in indices)
        return {
            "NVIDIA_VISIBLE_DEVICES": visible,
            "VOLCANO_GPU_ALLOCATED": str(len(indices)),
            "VOLCANO_GPU_MEMORY_TOTAL": "16384",
            "VOLCANO_GPU_TOTAL": "16384",
        }

    right: list[Response] = [("a", GPU_NUMBER, envs(3), []), ("b", GPU_NUMBER, envs(0, 2), [])]
    assert problems(the_pod, NUMBER, *right) == []
    swapped: list[Response] = [("a", GPU_NUMBER, envs(0), []), ("b", GPU_NUMBER, envs(3, 2), [])]
    assert problems(the_pod, NUMBER, *swapped) == [
        f"ns/p container a: NVIDIA_VISIBLE_DEVICES names GPU(s) 0; {GIVES} 3",
        f"ns/p container b: NVIDIA_VISIBLE_DEVICES names GPU(s) 3,2; {GIVES} 0,2",
    ]


VGPU_LIMITS = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1024", "volcano.sh/vgpu-cores": "30"}


def vgpu_pod(memory: int = 1024, cores: int = 30) -> Any:
    ids = f"{uuid(VGPU, 1)},NVIDIA,{memory},{cores}:"
    notes = {"volcano.sh/vgpu-ids-new": ids, "volcano.sh/bind-phase": "success"}
    return pod({"idle": {}, "c": VGPU_LIMITS}, notes)


def vgpu_env(limit: str = "1024m", cores: str = "30") -> dict[str, str]:
    return {
        "NVIDIA_VISIBLE_DEVICES": uuid(VGPU, 1),
        "CUDA_DEVICE_MEMORY_LIMIT_0": limit,
        "CUDA_DEVICE_SM_LIMIT": cores,
    }


def test_vgpu_container_limited_as_it_asked_passes() -> None:
    assert problems(vgpu_pod(), VGPU, ("c", "volcano.sh/vgpu-number", vgpu_env(), [LIBRARY])) == []


@pytest.mark.parametrize(
    ("the_pod", "envs", "mounts", "wrong"),
    [
        (
            vgpu_pod(),
            vgpu_env("2048m"),
            [LIBRARY],
            "c: CUDA_DEVICE_MEMORY_LIMIT_0='2048m' and the scheduler's 1024 unit(s) of 1 MiB; the request "
            "gives 1024 unit(s), 1024m",
        ),
        (
            vgpu_pod(memory=2048),
            vgpu_env("2048m"),
            [LIBRARY],
            "CUDA_DEVICE_MEMORY_LIMIT_0='2048m' and the scheduler's 2048 unit(s) of 1 MiB; the request "
            "gives 1024 unit(s), 1024m",
        ),
        (vgpu_pod(), vgpu_env(cores="0"), [LIBRARY], "c: CUDA_DEVICE_SM_LIMIT='0'; it asks 30%"),
        (vgpu_pod(cores=0), vgpu_env(cores="0"), [LIBRARY], "the scheduler booked 0% of GPU 1; it asks 30%"),
        (
            vgpu_pod(),
            vgpu_env(),
            [],
            "c: HAMi-core's library is not mounted at /usr/local/vgpu/libvgpu.so: no limit is enforced",
        ),
        (
            vgpu_pod(),
            vgpu_env() | {"NVIDIA_VISIBLE_DEVICES": uuid(VGPU, 0)},
            [LIBRARY],
            f"c: NVIDIA_VISIBLE_DEVICES={uuid(VGPU, 0)}; the scheduler's volcano.sh/vgpu-ids-new gives it "
            f"{uuid(VGPU, 1)}",
        ),
    ],
    ids=["env-memory", "booked-memory", "env-cores", "booked-cores", "no-hook", "other-gpu"],
)
def test_vgpu_container_given_anything_else_fails(
    the_pod: Any, envs: dict[str, str], mounts: list[dp.Mount], wrong: str
) -> None:
    found = problems(the_pod, VGPU, ("c", "volcano.sh/vgpu-number", envs, mounts))
    assert any(wrong in problem for problem in found), found


@pytest.fixture
def mps_root() -> Iterator[Path]:
    """An MPS root (short: its socket path must fit) where GPU 1's control daemon listens."""
    with scratch_dir("mps-") as root, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
        pipe = root / uuid(MPS, 1) / "pipe"
        pipe.mkdir(parents=True)
        control.bind(str(pipe / "control"))
        control.listen(1)
        yield root


def mps_pod(memory: int = 4096, cores: int = 30) -> Any:
    ids = f"{uuid(MPS, 1)},NVIDIA,{memory},{cores}:"
    notes = {"volcano.sh/vgpu-ids-new": ids, "volcano.sh/bind-phase": "success"}
    limits = VGPU_LIMITS | {"volcano.sh/vgpu-memory": "4096"}
    return pod({"c": limits}, notes)


def mps_env(percent: str = "30", limit: str = "0=4096M") -> dict[str, str]:
    return {
        "NVIDIA_VISIBLE_DEVICES": uuid(MPS, 1),
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percent,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limit,
    }


def mps_mounts(root: Path, gpu: int = 1) -> list[dp.Mount]:
    return [
        dp.Mount(container_path="/tmp/nvidia-mps", host_path=str(root / uuid(MPS, gpu) / "pipe")),
        dp.Mount(container_path="/dev/shm", host_path=str(root / "shm")),
    ]


def test_mps_container_held_by_its_gpus_daemon_passes(mps_root: Path) -> None:
    assert problems(mps_pod(), MPS, ("c", "volcano.sh/vgpu-number", mps_env(), mps_mounts(mps_root))) == []


@pytest.mark.parametrize(
    ("the_pod", "envs", "mounts", "wrong"),
    [
        (
            mps_pod(),
            mps_env(percent="100"),
            "right",
            "c: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='100', wanted '30'",
        ),
        (mps_pod(), mps_env(limit="0=8192M"), "right", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='0=8192M', wanted"),
        (mps_pod(cores=0), mps_env(), "right", "the scheduler booked 4096 unit(s) and 0% of GPU 1; it asks"),
        (
            mps_pod(),
            mps_env() | {"CUDA_DEVICE_SM_LIMIT": "30"},
            "right",
            "c: CUDA_DEVICE_SM_LIMIT='30', wanted None",
        ),
        (mps_pod(), mps_env(), "other-gpu", f"/{uuid(MPS, 0)}/pipe (rw), not GPU 1's pipe directory"),
        (mps_pod(), mps_env(), "no-shm", "c: /dev/shm is mounted from nowhere, not "),
        (mps_pod(), mps_env(), "hook", "c: an MPS client mounts only its pipe and shm, yet it got /usr/"),
    ],
    ids=["raised-cores", "raised-memory", "booked-cores", "hami-core-env", "other-pipe", "no-shm", "hook"],
)
def test_mps_container_given_anything_else_fails(
    mps_root: Path, the_pod: Any, envs: dict[str, str], mounts: str, wrong: str
) -> None:
    given = {
        "right": mps_mounts(mps_root),
        "other-gpu": mps_mounts(mps_root, gpu=0),
        "no-shm": mps_mounts(mps_root)[:1],
        "hook": [*mps_mounts(mps_root), LIBRARY],
    }[mounts]
    found = problems(the_pod, MPS, ("c", "volcano.sh/vgpu-number", envs, given))
    assert any(wrong in problem for problem in found), found


def test_mps_container_whose_daemon_does_not_listen_fails() -> None:
    with scratch_dir("mps-") as root:  # GPU 1's pipe directory exists; no control daemon in it
        (root / uuid(MPS, 1) / "pipe").mkdir(parents=True)
        found = problems(mps_pod(), MPS, ("c", "volcano.sh/vgpu-number", mps_env(), mps_mounts(root)))
    pipe = root / uuid(MPS, 1) / "pipe"
    assert found == [f"ns/p container c: no MPS control daemon listens in {pipe}, the pipe it mounts"]


def test_a_container_asking_no_gpu_must_get_none() -> None:
    found = problems(
        vgpu_pod(),
        VGPU,
        ("c", "volcano.sh/vgpu-number", vgpu_env(), [LIBRARY]),
        ("idle", "volcano.sh/vgpu-number", {"NVIDIA_VISIBLE_DEVICES": uuid(VGPU, 0)}, []),
    )
    assert found == [f"ns/p container idle: asks for no GPU but got NVIDIA_VISIBLE_DEVICES={uuid(VGPU, 0)}"]


def test_two_resources_giving_one_env_var_two_values_is_a_failure_and_the_first_wins() -> None:
    the_pod = vgpu_pod()
    responses = [
        ("c", "volcano.sh/vgpu-number", vgpu_env(), [LIBRARY]),
        ("c", "volcano.sh/vgpu-memory", {"CUDA_DEVICE_MEMORY_LIMIT_0": "99m"}, []),
    ]
    views, conflicts = received(the_pod, admitted(the_pod, *responses))
    assert conflicts == [
        "container c: CUDA_DEVICE_MEMORY_LIMIT_0 is '1024m' from volcano.sh/vgpu-number and '99m' from "
        "volcano.sh/vgpu-memory; kubelet keeps the first"
    ]
    assert next(v for v in views if v.name == "c").env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"


def test_an_unserved_pod_is_a_failure_once_its_containers_are_right() -> None:
    unmarked = pod({"c": {"volcano.sh/gpu-memory": "1024"}}, {"volcano.sh/gpu-index": "1"})
    assert problems(unmarked, SHARE, ("c", "volcano.sh/gpu-memory", share_env(1), [])) == [
        "ns/p: the plugin never marked it volcano.sh/gpu-assigned=true"
    ]


def test_a_pod_s_own_gpu_index_is_reported_with_what_the_scheduler_wrote() -> None:
    submitted = pod({"c": {"volcano.sh/gpu-memory": "1024"}}, {"volcano.sh/gpu-index": "1"})
    placed = pod({"c": {"volcano.sh/gpu-memory": "1024"}}, {"volcano.sh/gpu-index": "0"})
    (problem,) = own_scheduler_annotations(submitted, placed)
    assert problem.startswith(
        "ns/p: its own volcano.sh/gpu-index='1' is not honoured: the scheduler owns that annotation and "
        "overwrites it at bind; the scheduler wrote '0'"
    )
