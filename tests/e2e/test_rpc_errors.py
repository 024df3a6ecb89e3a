"""An exception no gRPC handler expects (a bug) is answered INTERNAL, naming the call and the
exception, and logged with its traceback (issue 13, item 3); gRPC's own answer was UNKNOWN
"Exception calling application" and the daemon logged nothing. The daemon as a subprocess, each
call over its real plugin socket. No real fault reaches GetDevicePluginOptions or
PreStartContainer (nor, now, Allocate: see test_storage_faults), so the supervisor's test hook
($DEVICEPLUGIN_WORKER_FAULTS) makes the handlers its file names raise."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.supervisor import FAULTS_ENV
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import TIMEOUT_S, Daemon, eventually, streaming
from tests.e2e import test_allocate as share

DevicePluginStub: Callable[[grpc.Channel], Any] = deviceplugin_grpc.DevicePluginStub
CALLS: dict[str, Callable[[Any], object]] = {
    "GetDevicePluginOptions": lambda stub: stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT_S),
    "ListAndWatch": lambda stub: next(stub.ListAndWatch(pb.Empty(), timeout=TIMEOUT_S)),
    "GetPreferredAllocation": lambda stub: stub.GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=["0-1", "0-2"], allocation_size=1)
            ]
        ),
        timeout=TIMEOUT_S,
    ),
    "Allocate": lambda stub: stub.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["0-1"])]),
        timeout=TIMEOUT_S,
    ),
    "PreStartContainer": lambda stub: stub.PreStartContainer(
        pb.PreStartContainerRequest(devices_ids=["0-1"]), timeout=TIMEOUT_S
    ),
}


def logged(daemon: Daemon, text: str) -> bool:
    return text in daemon.output()


def test_an_exception_in_any_handler_is_answered_internal_and_logged(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    faults = workdir / "faults"
    daemon = start(
        "--fake-gpus",
        "2x10989",
        "--kubeconfig",
        str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
        env={FAULTS_ENV: str(faults)},
    )
    assert kubelet.wait_for(streaming(share.MEM), TIMEOUT_S), daemon.output()
    faults.write_text("".join(f"{name}\n" for name in CALLS))
    with grpc.insecure_channel(f"unix://{workdir / 'plugins' / 'volcano.sock'}") as channel:
        stub = DevicePluginStub(channel)
        for name, call in CALLS.items():
            with pytest.raises(grpc.RpcError) as failed:
                call(stub)
            assert failed.value.code() == grpc.StatusCode.INTERNAL, (name, failed.value)
            assert failed.value.details().startswith(
                f"{share.MEM}: {name} failed: InjectedFault at supervisor.py:"
            ), failed.value.details()
            eventually(partial(logged, daemon, f'"rpc failed" resource={share.MEM} rpc={name} '), daemon)
        assert daemon.output().count("traceback=") == len(CALLS)
        assert "Exception calling application" not in daemon.output()

        faults.write_text("")
        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT_S)
        assert options.get_preferred_allocation_available
        assert next(stub.ListAndWatch(pb.Empty(), timeout=TIMEOUT_S)).devices
