"""Adversarial cases for the daemon found after issue 13 was built: the real daemon as a
subprocess, the kubelet emulator over gRPC sockets, the API emulator."""

from __future__ import annotations

import contextlib
import shutil
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import TIMEOUT_S, VGPU, Daemon, eventually, streaming
from tests.e2e import test_allocate as share
from tests.e2e import test_vgpu as vgpu
from tests.e2e.test_ledger_rebuild import serve_vgpu_worker


def rows(ledger: Path) -> list[tuple[str, str]]:
    """(pod, state) rows of the ledger file at `ledger`; none when it is not there."""
    if not ledger.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
        return db.execute("SELECT pod_name, state FROM allocations ORDER BY pod_name").fetchall()


def test_a_removed_state_dir_is_restored_with_every_row(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """`rm -rf` of the state dir under a running daemon: its writes went on into the unlinked
    file, readiness stayed green, and everything allocated since was gone at the next start.
    Now the next write (or readiness check) puts the whole ledger back at its path."""
    daemon = share.launch(start, apiserver, kubelet, workdir)
    share.admit(kubelet, share.make_pod(apiserver, "before", 1024), daemon)
    state = workdir / "state"
    shutil.rmtree(state)

    share.admit(kubelet, share.make_pod(apiserver, "during", 1024), daemon)
    ledger = state / "ledger.db"
    eventually(lambda: rows(ledger) == [("before", "allocated"), ("during", "allocated")], daemon)
    assert ledger.stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    assert "ledger file removed" in daemon.output()
    share.admit(kubelet, share.make_pod(apiserver, "after", 1024), daemon)
    eventually(lambda: ("after", "allocated") in rows(ledger), daemon)


def allocate(kubelet: KubeletEmulator, workdir: Path, device_ids: list[str]) -> grpc.RpcError:
    """A hostile client's Allocate of `device_ids` on the daemon's gpu-memory socket: its error."""
    endpoint = next(r.endpoint for r in kubelet.registrations if r.resource == share.MEM)
    with grpc.insecure_channel(f"unix://{workdir / 'plugins' / endpoint}") as channel:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        with pytest.raises(grpc.RpcError) as refused:
            deviceplugin_grpc.DevicePluginStub(channel).Allocate(request, timeout=30)
    return refused.value


def test_a_huge_unknown_device_id_gets_a_clear_error_not_a_broken_stream(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """A 1 MB device ID: the refusal quoted it whole, over gRPC's 16 KiB limit on a status message,
    so the client got `RESOURCE_EXHAUSTED: Stream removed (received metadata size exceeds hard
    limit)` instead of the reason, and the daemon logged a 1 MB line."""
    daemon = share.launch(start, apiserver, kubelet, workdir)
    error = allocate(kubelet, workdir, ["x" * 1_000_000, "0-1"])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "are not devices of this node" in error.details() and "1000000 characters" in error.details()
    assert max(len(line) for line in daemon.output().splitlines()) < 10_000
    share.admit(kubelet, share.make_pod(apiserver, "after", 1024), daemon)  # still serving


def alias_bomb(option: str, levels: int = 9) -> str:
    """A YAML value of nine lists of nine, each an alias of the one before: a few hundred bytes
    that expand to 9**levels strings when walked or printed (the 'billion laughs')."""
    lists = ['&l0 ["x","x","x","x","x","x","x","x","x"]']
    lists += [f"&l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return f"{option}: [{', '.join(lists)}]\n"


def test_a_config_file_alias_bomb_is_refused_on_reload_and_the_daemon_serves_on(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """SIGHUP after the config file became a YAML alias bomb: the refusal's message printed the
    value whole, so the daemon stalled in the reload, its memory growing by gigabytes (1.6 GB in
    30 s) until the kernel killed it. Now the file is refused, naming it, and the daemon goes on."""
    config = workdir / "config.yaml"
    config.write_text("log-level: info\n")
    daemon = share.launch(start, apiserver, kubelet, workdir, "--config", str(config))
    config.write_text(alias_bomb("metrics-address"))
    daemon.process.send_signal(signal.SIGHUP)
    eventually(lambda: "reload refused" in daemon.output(), daemon)
    assert f"config file {config}" in daemon.output() and "aliases" in daemon.output()
    share.admit(kubelet, share.make_pod(apiserver, "after", 1024), daemon)
    eventually(lambda: share.assigned(apiserver, "after"), daemon)


def test_a_new_nodes_first_start_registers_before_the_api_answers(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """No ledger yet, and kubelet shows no container holding the node's devices: nothing can have
    been lost, so the daemon registers without first reading the pods (a rebuild would wait for
    them: most of a first start, bench/startup.py), and serves once the API answers."""
    held = apiserver.faults.hang(method="GET", path="/pods")
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    daemon = start("--fake-gpus", "2x10989", "--kubeconfig", str(kubeconfig))
    assert kubelet.wait_for(streaming(share.MEM), TIMEOUT_S), daemon.output()
    assert "nothing to rebuild" in daemon.output()
    assert "pod cache listed" not in daemon.output()  # registered while the pods were held
    apiserver.faults.clear(held)
    eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    share.admit(kubelet, share.make_pod(apiserver, "first", 1024), daemon)
    eventually(lambda: share.assigned(apiserver, "first"), daemon)


def test_a_state_dir_wiped_while_stopped_keeps_running_containers_caches_and_rows(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """The state dir gone between two runs (wiped hostPath, a new path on upgrade): the daemon
    started a new ledger and took it as the truth, so it removed HAMi-core's cache directory of a
    vGPU container still running (no row mounted it) and knew none of the node's allocations.
    Now a ledger found missing is rebuilt as a corrupt one is, and the caches are kept."""
    state = workdir / "state"
    args = ("--fake-gpus", "2x10989")
    daemon, pod, admission, cache = serve_vgpu_worker(apiserver, kubelet, start, workdir, *args)
    before = rows(state / "ledger.db")
    assert daemon.stop() == 0

    shutil.rmtree(state)
    hook, kubeconfig = str(workdir / "hook"), str(workdir / "kubeconfig")
    daemon = start("--gpu-strategy", "vgpu", "--hook-path", hook, "--kubeconfig", kubeconfig, *args)
    assert kubelet.wait_for(streaming(*VGPU), TIMEOUT_S), daemon.output()
    eventually(lambda: rows(state / "ledger.db") == before, daemon)
    assert "nothing to rebuild" not in daemon.output()
    assert (cache / "state").read_text() == "HAMi-core's shared region"
    number = admission.allocation("worker", vgpu.NUMBER).response
    assert kubelet.reallocate(pod["metadata"]["uid"], "worker", vgpu.NUMBER) == number
