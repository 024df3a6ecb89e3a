"""One unreadable pod costs only itself (issue 13, F1): the daemon as a subprocess, pods in the
API-server emulator, admitted by the kubelet emulator over real sockets. A pod bound to the node
with a 4,301-digit scheduler annotation used to kill the pod cache: every later Allocate on the
node failed while `/readyz` said ok, and after a restart the cache never listed again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import Daemon, eventually
from tests.e2e import test_allocate as share
from tests.e2e import test_vgpu as vgpu

POISON = "9" * 4301  # one digit past what Python's int() converts


def rejected_pods(daemon: Daemon) -> float:
    return vgpu.samples(daemon, "volcano_gpu_plugin_objects_rejected_total")[(("kind", "pod"),)]


@pytest.fixture
def share_daemon(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> Daemon:
    return share.launch(start, apiserver, kubelet, workdir)


def rejections(apiserver: ApiServerEmulator, name: str) -> list[dict[str, Any]]:
    return [
        event
        for event in apiserver.list("events", "ml")
        if event["involvedObject"]["name"] == name and event["reason"] == "GpuPodRejected"
    ]


def check_isolated(
    apiserver: ApiServerEmulator, daemon: Daemon, admit_good: Callable[[str], None], poison: str
) -> None:
    """A good pod created after the poison is served; the poison gets one Warning Event, one log
    line and one count however often it changes; the daemon stays ready."""
    admit_good("good-1")
    eventually(lambda: len(rejections(apiserver, poison)) == 1, daemon)
    (event,) = rejections(apiserver, poison)
    assert event["type"] == "Warning" and "not served" in event["message"]
    assert rejected_pods(daemon) == 1
    apiserver.patch("pods", poison, {"metadata": {"labels": {"touched": "yes"}}}, "ml")
    admit_good("good-2")  # the daemon's watch saw the patch before this pod
    assert rejected_pods(daemon) == 1
    assert len(rejections(apiserver, poison)) == 1
    assert daemon.output().count("pod rejected") == 1, daemon.output()
    assert vgpu.get(daemon.metrics_url() + "/readyz") == (200, "ok\n")


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param({"predicate_time": POISON}, id="predicate-time"),
        pytest.param({"gpu_index": POISON}, id="gpu-index"),
    ],
)
def test_a_share_pod_with_a_huge_annotation_costs_only_itself(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, share_daemon: Daemon, annotation: dict[str, Any]
) -> None:
    share.make_pod(apiserver, "poison", 2048, **annotation)

    def admit_good(name: str) -> None:
        admission = share.admit(kubelet, share.make_pod(apiserver, name, 1024), share_daemon)
        assert admission.allocation("cuda", share.MEM).envs["VOLCANO_GPU_ALLOCATED"] == "1024"

    check_isolated(apiserver, share_daemon, admit_good, "poison")


def test_a_vgpu_pod_with_a_huge_vgpu_time_costs_only_itself(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = vgpu.launch(start, apiserver, kubelet, workdir, "--fake-gpus", "2x10989")
    vgpu.worker(apiserver, "poison", 2048, 0, POISON, number=2)  # another count: never a candidate

    def admit_good(name: str) -> None:
        admission = kubelet.admit(vgpu.worker(apiserver, name, 1024, 0, 1000))
        assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
        assert admission.allocation("worker", vgpu.NUMBER).envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"

    check_isolated(apiserver, daemon, admit_good, "poison")


def test_a_poison_pod_there_at_start_does_not_stop_the_cache(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """After a restart the poison pod comes in the first list: the cache must list all the same."""
    share.make_pod(apiserver, "poison", 2048, gpu_index=POISON)
    daemon = share.launch(start, apiserver, kubelet, workdir)  # waits for "pod cache listed"

    def admit_good(name: str) -> None:
        share.admit(kubelet, share.make_pod(apiserver, name, 1024), daemon)

    check_isolated(apiserver, daemon, admit_good, "poison")


def test_a_pod_that_asks_for_no_gpus_gets_no_event(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, share_daemon: Daemon
) -> None:
    """Any pod bound to the node passes through the cache: one that asks for no GPUs must not stop
    it either, and its owner is not told about GPUs it never asked for."""
    share.make_pod(apiserver, "cpu-only", 0, predicate_time=POISON)
    share.admit(kubelet, share.make_pod(apiserver, "good", 1024), share_daemon)
    assert rejections(apiserver, "cpu-only") == []
    assert vgpu.get(share_daemon.metrics_url() + "/readyz") == (200, "ok\n")
