"""Relative socket paths: `--device-plugin-dir` and `--pod-resources-socket` are taken from the working
directory (gRPC read `unix://plugins/...` as a host name `plugins` and the daemon never bound)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from deviceplugin.config import load_config
from deviceplugin.fit import keys
from kubesim.kubelet import KubeletEmulator
from tests.daemons import TIMEOUT_S, Daemon, eventually, streaming


def test_the_daemon_serves_and_lists_through_relative_socket_paths(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    plugins = os.path.relpath(workdir / "plugins")
    pod_resources = os.path.relpath(workdir / "pod-resources.sock")
    assert not Path(plugins).is_absolute() and not Path(pod_resources).is_absolute()
    daemon = start(
        "--fake-gpus",
        "1x1000",
        "--metrics-address",
        "127.0.0.1:0",
        # later flags win: these replace the absolute paths the fixture passes
        *("--device-plugin-dir", plugins, "--pod-resources-socket", pod_resources),
        "--reconcile-interval",
        "1",
    )
    assert kubelet.wait_for(streaming(keys.GPU_MEMORY), TIMEOUT_S), daemon.output()
    eventually(lambda: kubelet.pod_resources_calls.by_method.get("List", 0) > 0, daemon)


def test_relative_paths_are_resolved_from_the_working_directory_at_start() -> None:
    config = load_config(
        {"node-name": "n1", "device-plugin-dir": "dp", "pod-resources-socket": "pr/kubelet.sock"}, {}
    )
    assert config.device_plugin_dir == Path.cwd() / "dp"
    assert config.kubelet_socket == Path.cwd() / "dp" / "kubelet.sock"
    assert config.pod_resources_socket == Path.cwd() / "pr" / "kubelet.sock"
