"""vGPU Allocate on an `mps` node (issue 16 item 3, docs/mps.md), in process against the API-server
emulator with a real ledger and real control-daemon processes (the stand-in
`deviceplugin/gpu/fake_mps_control.py`, one per GPU under a temporary MPS root): what a container
gets, the limits set on its GPU's daemon, and a daemon that dies mid-run."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys
from deviceplugin.gpu.mps import MpsControl, MpsDaemons, MpsError, MpsRoot
from deviceplugin.plugin.devices import Layout
from deviceplugin.plugin.families import node_family_of
from deviceplugin.plugin.vgpu import VgpuAllocator
from kubesim.apiserver import ApiServerEmulator
from tests.plugin.rig import GPUS, Rig, close_rig, envs, make_rig
from tests.plugin.test_vgpu_allocate import refused, settled, vpod

FAKE = str(Path(__file__).parents[2] / "deviceplugin" / "gpu" / "fake_mps_control.py")
MPS_POD = {"volcano.sh/vgpu-mode": "mps"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def quit_all(control: MpsControl, uuids: tuple[str, ...]) -> None:
    for uuid in uuids:
        with contextlib.suppress(MpsError):  # not running
            control.ask(uuid, "quit")


def mps_allocator(rig: Rig, daemons: MpsDaemons) -> VgpuAllocator:
    """The rig's vGPU allocator again, on an mps node of `daemons`."""
    old = rig.allocator
    return VgpuAllocator(
        old.devices,
        rig.health,
        rig.pods,
        rig.ledger,
        rig.events,
        hook_path=old.hook,  # type: ignore[attr-defined]
        mps=daemons,
        node_name=old.node_name,
        timeout_s=1.0,
        on_outbox=rig.outbox.wake,
    )


@pytest.fixture
def mps(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[tuple[Rig, MpsDaemons, Clock]]:
    rig = make_rig(tmp_path, apiserver, "vgpu")
    control = MpsControl(FAKE, MpsRoot(tmp_path / "mps"))
    uuids = tuple(gpu.uuid for gpu in GPUS)
    clock = Clock()
    daemons = MpsDaemons(control, uuids, rig.health, managed=True, clock=clock)
    daemons.check()  # what `start` does first; the tests drive the later checks themselves
    rig.allocator = mps_allocator(rig, daemons)
    yield rig, daemons, clock
    quit_all(control, uuids)
    close_rig(rig)


def commands(daemons: MpsDaemons, uuid: str) -> list[str]:
    return (daemons.control.root.log_dir(uuid) / "control.log").read_text().splitlines()


def kill(daemons: MpsDaemons, uuid: str) -> None:
    pid = int((daemons.control.root.pipe_dir(uuid) / "nvidia-cuda-mps-control.pid").read_text())
    os.kill(pid, signal.SIGKILL)


def test_a_container_gets_its_gpu_through_its_mps_daemon_and_nothing_of_hami_core(
    mps: tuple[Rig, MpsDaemons, Clock],
) -> None:
    rig, daemons, _ = mps
    root = daemons.control.root.root
    vpod(rig, "infer", [("cuda", [("GPU-111", 3000, 30)])], annotations=MPS_POD)
    response = rig.allocator.allocate(["GPU-111-0"])
    expected = pb.ContainerAllocateResponse()
    expected.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-111"
    expected.envs["CUDA_MPS_PIPE_DIRECTORY"] = "/tmp/nvidia-mps"
    expected.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "30"
    expected.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=3000M"
    expected.mounts.add(container_path="/tmp/nvidia-mps", host_path=f"{root}/GPU-111/pipe")
    expected.mounts.add(container_path="/dev/shm", host_path=f"{root}/shm")
    assert response.SerializeToString() == expected.SerializeToString()  # byte for byte
    # the limits the container cannot raise: on its GPU's daemon, no other GPU's
    assert commands(daemons, "GPU-111")[-2:] == [
        "set_default_device_pinned_mem_limit 0 3000M",
        "set_default_active_thread_percentage 30",
    ]
    assert "set_default_active_thread_percentage 30" not in commands(daemons, "GPU-000")
    hook_root = rig.allocator.hook.root  # type: ignore[attr-defined]
    assert list((hook_root / "containers").glob("*")) == []  # no HAMi-core cache directory
    (row,) = rig.ledger.active()
    assert [(g.uuid, g.memory, g.cores) for g in row.gpus] == [("GPU-111", 3000, 30)]
    assert settled(rig, "infer", "success")["volcano.sh/devices-to-allocate"] == ""


def test_the_daemons_ceiling_is_the_largest_live_limit_on_its_gpu(mps: tuple[Rig, MpsDaemons, Clock]) -> None:
    rig, daemons, _ = mps
    vpod(rig, "big", [("cuda", [("GPU-000", 6000, 60)])], annotations=MPS_POD, vgpu_time=1)
    vpod(rig, "small", [("cuda", [("GPU-000", 1000, 0)])], annotations=MPS_POD, vgpu_time=2)
    rig.allocator.allocate(["GPU-000-0"])
    small = rig.allocator.allocate(["GPU-000-1"])
    assert envs(small)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1000M"
    assert envs(small)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"  # no cores booked: the whole GPU
    # the big container keeps its 6000M (the small one's 100 % of threads is the ceiling now)
    assert commands(daemons, "GPU-000")[-2:] == [
        "set_default_device_pinned_mem_limit 0 6000M",
        "set_default_active_thread_percentage 100",
    ]


def test_a_slot_of_two_gpus_is_refused(mps: tuple[Rig, MpsDaemons, Clock]) -> None:
    rig, _, _ = mps
    vpod(rig, "two", [("cuda", [("GPU-000", 1000, 0), ("GPU-111", 1000, 0)])], annotations=MPS_POD)
    refused(rig, "two", ["GPU-000-0", "GPU-111-0"], grpc.StatusCode.INVALID_ARGUMENT, "gives it 2 GPUs")


def test_a_hami_core_pod_is_refused_on_an_mps_node(mps: tuple[Rig, MpsDaemons, Clock]) -> None:
    rig, _, _ = mps
    vpod(rig, "core", [("cuda", [("GPU-000", 1000, 0)])], annotations={"volcano.sh/vgpu-mode": "hami-core"})
    refused(rig, "core", ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "runs mps only")


def test_a_daemon_that_dies_makes_its_gpu_unhealthy_until_it_is_restarted(
    mps: tuple[Rig, MpsDaemons, Clock],
) -> None:
    rig, daemons, clock = mps
    flips: list[tuple[str, bool, str]] = []
    rig.health.add_listener(lambda uuid, healthy, reason: flips.append((uuid, healthy, reason)))
    assert daemons.starts["GPU-111"] == 1
    refusal = daemons.control.root.pipe_dir("GPU-111").parent / "fake-start-fails"
    refusal.write_text("the driver refuses MPS")
    kill(daemons, "GPU-111")
    daemons.check()
    assert rig.health.snapshot()[1] == {"GPU-000": True, "GPU-111": False, "GPU-222": True}
    ((uuid, healthy, reason),) = flips  # what the GpuUnhealthy Event says
    assert (uuid, healthy) == ("GPU-111", False)
    assert reason.startswith("its MPS control daemon does not answer: ") and FAKE in reason
    # meanwhile an Allocate naming the GPU is refused: an Event, bind-phase failed, no ledger row
    vpod(rig, "waits", [("cuda", [("GPU-111", 1000, 0)])], annotations=MPS_POD)
    refused(
        rig,
        "waits",
        ["GPU-111-0"],
        grpc.StatusCode.FAILED_PRECONDITION,
        "GPU 1 (GPU-111), which is unhealthy",
    )
    refusal.unlink()
    daemons.check()  # within the back-off after the failed start: not tried again yet
    assert rig.health.snapshot()[1]["GPU-111"] is False
    clock.now += 60
    daemons.check()
    assert rig.health.snapshot()[1]["GPU-111"] is True
    assert flips[1:] == [("GPU-111", True, "its MPS control daemon answers")]
    assert daemons.starts["GPU-111"] == 2
    vpod(rig, "later", [("cuda", [("GPU-111", 1000, 0)])], annotations=MPS_POD)
    assert envs(rig.allocator.allocate(["GPU-111-0"]))["NVIDIA_VISIBLE_DEVICES"] == "GPU-111"


def limits(daemons: MpsDaemons, uuid: str) -> tuple[str, str]:
    """What the GPU's daemon itself holds: its pinned memory limit and thread percentage."""
    control = daemons.control
    return control.ask(uuid, "get_default_device_pinned_mem_limit 0"), control.ask(
        uuid, "get_default_active_thread_percentage"
    )


@pytest.mark.parametrize("managed", [True, False])
def test_a_daemon_that_comes_back_takes_its_gpus_limits_again_before_its_gpu_is_healthy(
    mps: tuple[Rig, MpsDaemons, Clock], managed: bool
) -> None:
    """A control daemon that died forgot the limits set on it: restarted here (or by a sidecar), it
    takes the last ones again, so the servers it starts next hold the containers to them."""
    rig, daemons, _ = mps
    daemons.managed = managed
    vpod(rig, "infer", [("cuda", [("GPU-111", 3000, 30)])], annotations=MPS_POD)
    rig.allocator.allocate(["GPU-111-0"])
    assert limits(daemons, "GPU-111") == ("3000M", "30")
    kill(daemons, "GPU-111")
    daemons.check()
    if not managed:
        assert rig.health.snapshot()[1]["GPU-111"] is False
        daemons.control.start("GPU-111")  # the sidecar starts it again
        daemons.check()
    assert rig.health.snapshot()[1]["GPU-111"] is True
    assert limits(daemons, "GPU-111") == ("3000M", "30")
    assert limits(daemons, "GPU-000") == ("0", "100.0")  # no container there: nothing set


def test_a_plugin_that_starts_sets_the_limits_of_its_live_containers(
    mps: tuple[Rig, MpsDaemons, Clock],
) -> None:
    """A daemon that died while the plugin was down came back without its limits: the next
    plugin's allocator sets them from the ledger before it serves anything."""
    rig, daemons, clock = mps
    vpod(rig, "big", [("cuda", [("GPU-111", 6000, 0)])], annotations=MPS_POD, vgpu_time=1)
    vpod(rig, "small", [("cuda", [("GPU-111", 1000, 40)])], annotations=MPS_POD, vgpu_time=2)
    rig.allocator.allocate(["GPU-111-0"])
    rig.allocator.allocate(["GPU-111-1"])
    kill(daemons, "GPU-111")
    daemons.control.start("GPU-111")  # a sidecar, or the next plugin's first check
    assert limits(daemons, "GPU-111") == ("0", "100.0")
    again = MpsDaemons(daemons.control, daemons.uuids, rig.health, managed=True, clock=clock)
    mps_allocator(rig, again)
    assert limits(daemons, "GPU-111") == ("6000M", "100")  # the larger of the two containers' each
    assert limits(daemons, "GPU-000") == ("0", "100.0")
    sent = len(commands(daemons, "GPU-111"))
    mps_allocator(rig, again)  # the node's other vGPU allocator (vgpu-memory) on the same daemons
    assert len(commands(daemons, "GPU-111")) == sent  # set once


def test_a_plugin_starts_beside_a_daemon_that_does_not_answer(mps: tuple[Rig, MpsDaemons, Clock]) -> None:
    """Setting the live limits at start is best effort: a dead daemon is the health check's to
    report (and the next Allocate's to refuse), not a reason for the plugin not to start."""
    rig, daemons, clock = mps
    vpod(rig, "infer", [("cuda", [("GPU-111", 3000, 30)])], annotations=MPS_POD)
    rig.allocator.allocate(["GPU-111-0"])
    kill(daemons, "GPU-111")
    again = mps_allocator(
        rig, MpsDaemons(daemons.control, daemons.uuids, rig.health, managed=True, clock=clock)
    )
    vpod(rig, "next", [("cuda", [("GPU-000", 1000, 0)])], annotations=MPS_POD, vgpu_time=2)
    assert envs(again.allocate(["GPU-000-0"]))["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"  # it serves


def test_a_sidecars_daemons_are_only_checked(tmp_path: Path, apiserver: ApiServerEmulator) -> None:
    rig = make_rig(tmp_path, apiserver, "vgpu")
    control = MpsControl(FAKE, MpsRoot(tmp_path / "mps"))
    daemons = MpsDaemons(control, ("GPU-000",), rig.health, managed=False)
    try:
        daemons.check()
        assert rig.health.snapshot()[1]["GPU-000"] is False
        assert daemons.starts["GPU-000"] == 0  # never started here
        control.start("GPU-000")  # the sidecar starts it
        daemons.check()
        assert rig.health.snapshot()[1]["GPU-000"] is True
    finally:
        quit_all(control, ("GPU-000",))
        close_rig(rig)


def test_an_mps_node_registers_every_card_as_mps_and_uses_no_hook() -> None:
    family = node_family_of("vgpu", keys.MODE_MPS)
    assert (family.mode, family.uses_hook) == ("mps", False)
    state = family.node_state(GPUS[:2], {"GPU-000": True, "GPU-111": False}, Layout(split_count=4))
    register = state.annotations[keys.NODE_VGPU_REGISTER]
    assert register == "GPU-000,4,10989,NVIDIA-Fake GPU,true,mps:GPU-111,4,10989,NVIDIA-Fake GPU,false,mps:"
