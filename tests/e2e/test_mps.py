"""MPS mode end to end (issue 16 item 3, docs/mps.md): the daemon as a subprocess in `--vgpu-mode
mps` over fake GPUs, its control daemons the stand-in `deviceplugin/gpu/fake_mps_control.py`, a pod
bound with Volcano's annotations admitted by the kubelet emulator; then the GPU's control daemon
is killed, and the node's registration shows the GPU unhealthy until it is restarted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from deviceplugin.gpu.mps import MpsControl, MpsError, MpsRoot
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, NODE, Daemon, eventually
from tests.e2e.test_vgpu import NUMBER, REGISTER, launch, notes, worker
from tests.plugin.test_mps_allocate import FAKE


def test_an_mps_pod_is_served_and_a_dead_control_daemon_is_restarted(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    root = workdir / "mps"
    control = MpsControl(FAKE, MpsRoot(root))
    spec = workdir / "gpus.json"
    spec.write_text(json.dumps([{"uuid": GPU0, "model": "NVIDIA A10", "memory_mib": 23028}]))
    mode = ("--vgpu-mode", "mps", "--mps-root", str(root), "--mps-control", FAKE)
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpus", str(spec), *mode)
    try:
        eventually(lambda: notes(apiserver, "nodes", NODE).get(REGISTER, "").endswith(",true,mps:"), daemon)
        pod = worker(apiserver, "infer", 1000, 0, 1)
        admission = kubelet.admit(pod)
        assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
        envs = admission.allocation("worker", NUMBER).envs
        assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert envs["NVIDIA_VISIBLE_DEVICES"] == GPU0
        assert "CUDA_DEVICE_SM_LIMIT" not in envs

        pid = int((root / GPU0 / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        eventually(
            lambda: "gpu health changed" in daemon.output() and "healthy=False" in daemon.output(), daemon
        )
        eventually(lambda: daemon.output().count("mps control daemon started") >= 2, daemon)
        eventually(lambda: notes(apiserver, "nodes", NODE)[REGISTER].endswith(",true,mps:"), daemon)
    finally:
        with contextlib.suppress(MpsError):
            control.ask(GPU0, "quit")
