"""Kubelet emulator, pod-resources side: ``v1.PodResourcesLister`` over a real Unix socket."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import UNHEALTHY, podresources_grpc
from deviceplugin.api import podresources_pb2 as pr
from kubesim.kubelet import KubeletEmulator
from kubesim.podresources import POD_RESOURCES_BURST, POD_RESOURCES_QPS, RATE_LIMITED, TokenBucket
from tests.sim.test_kubelet import REPO_ROOT, WAIT_S, device, settle
from tests.sim.test_kubelet_admission import MEMORY, RESOURCE, Plugins, container, gpus, pod

pytestmark = pytest.mark.usefixtures("no_leaked_threads")

PodResourcesStub: Any = podresources_grpc.PodResourcesListerStub


def emulator(root: Path, **options: Any) -> KubeletEmulator:
    return KubeletEmulator(
        root / "device-plugins",
        dial_timeout_s=0.5,
        pod_resources_socket=root / "pod-resources" / "kubelet.sock",
        **options,
    )


@pytest.fixture
def kubelet(root: Path) -> Iterator[KubeletEmulator]:
    with emulator(root) as running:
        yield running


@pytest.fixture
def plugins(kubelet: KubeletEmulator) -> Iterator[Plugins]:
    served = Plugins(kubelet)
    yield served
    served.stop()


@contextmanager
def lister(kubelet: KubeletEmulator) -> Iterator[Any]:
    """A pod-resources client, as the ecosystem builds one (16 MiB receive limit)."""
    options = [("grpc.max_receive_message_length", 16 * 1024 * 1024)]
    with grpc.insecure_channel(f"unix:{kubelet.pod_resources_socket}", options) as channel:
        yield PodResourcesStub(channel)


def entries(resource: str, device_id: str, numa: Sequence[int] = ()) -> list[pr.ContainerDevices]:
    """Kubelet's rendering of one device: one entry per NUMA node, or one without topology."""
    if not numa:
        return [pr.ContainerDevices(resource_name=resource, device_ids=[device_id])]
    return [
        pr.ContainerDevices(
            resource_name=resource,
            device_ids=[device_id],
            topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]),
        )
        for node in numa
    ]


def admit_two_pods(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    numa = [
        device("GPU-0", numa=[0]),
        device("GPU-1", numa=[1]),
        device("GPU-2", numa=[0, 1]),
        device("GPU-3"),
    ]
    plugins.serve(numa, preferred_available=False)
    train = pod(
        "train",
        namespace="ml",
        init=[container("setup", {RESOURCE: 1}), container("proxy", {RESOURCE: 1}, sidecar=True)],
        containers=[container("main", {RESOURCE: 2}), container("logger")],
    )
    assert kubelet.admit(train).admitted
    assert kubelet.admit(pod("infer", containers=[container("main", {RESOURCE: 1})])).admitted


TRAIN = pr.PodResources(
    name="train",
    namespace="ml",
    # The run-to-completion init container is not listed; the sidecar (which reused its device) and
    # every app container are.
    containers=[
        pr.ContainerResources(name="proxy", devices=entries(RESOURCE, "GPU-0", [0])),
        pr.ContainerResources(
            name="main", devices=entries(RESOURCE, "GPU-1", [1]) + entries(RESOURCE, "GPU-2", [0, 1])
        ),
        pr.ContainerResources(name="logger"),
    ],
)
INFER = pr.PodResources(
    name="infer",
    namespace="default",
    containers=[pr.ContainerResources(name="main", devices=entries(RESOURCE, "GPU-3"))],
)


# --------------------------------------------------------------------------- content


def test_list_reports_admitted_pods_with_their_topology(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    admit_two_pods(kubelet, plugins)
    with lister(kubelet) as stub:
        response = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
    assert response == pr.ListPodResourcesResponse(pod_resources=[TRAIN, INFER])


def test_list_keeps_the_topology_seen_at_allocation(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve([device("GPU-0", numa=[0])], preferred_available=False)
    assert kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 1})])).admitted
    plugin.publish([device("GPU-0", numa=[1])])
    settle(kubelet, lambda state: state.messages == 2, RESOURCE)
    with lister(kubelet) as stub:
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
        allocatable = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=WAIT_S)
    assert list(listed.pod_resources[0].containers[0].devices) == entries(RESOURCE, "GPU-0", [0])
    assert list(allocatable.devices) == entries(RESOURCE, "GPU-0", [1])


def test_get_returns_one_pod(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    admit_two_pods(kubelet, plugins)
    with lister(kubelet) as stub:
        response = stub.Get(pr.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=WAIT_S)
        assert response == pr.GetPodResourcesResponse(pod_resources=TRAIN)
        with pytest.raises(grpc.RpcError) as error:
            stub.Get(pr.GetPodResourcesRequest(pod_name="train", pod_namespace="default"), timeout=WAIT_S)
    # Kubelet answers with a plain Go error, which gRPC turns into UNKNOWN (not NOT_FOUND).
    assert error.value.code() == grpc.StatusCode.UNKNOWN
    assert error.value.details() == "pod train in namespace default not found"


def test_allocatable_lists_every_healthy_device(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugins.serve([device("GPU-0", numa=[0]), device("GPU-1", UNHEALTHY, [1]), device("GPU-2", numa=[0, 1])])
    plugins.serve([device("MEM-0"), device("MEM-1")], MEMORY)
    # Devices in use still count: allocatable is capacity, not what is free.
    assert kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 1, MEMORY: 2})])).admitted
    with lister(kubelet) as stub:
        response = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=WAIT_S)
    expected = [
        *entries(RESOURCE, "GPU-0", [0]),
        *entries(RESOURCE, "GPU-2", [0, 1]),
        *entries(MEMORY, "MEM-0"),
        *entries(MEMORY, "MEM-1"),
    ]
    assert list(response.devices) == expected
    assert (list(response.cpu_ids), list(response.memory)) == ([], [])


def test_released_pods_leave_the_list(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    admit_two_pods(kubelet, plugins)
    assert kubelet.release("uid-train")
    with lister(kubelet) as stub:
        response = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
    assert list(response.pod_resources) == [INFER]


def listed_devices(stub: Any) -> dict[str, dict[str, list[str]]]:
    """Pod name -> resource -> device IDs, from one List call."""
    response = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
    found: dict[str, dict[str, list[str]]] = {}
    for listed in response.pod_resources:
        held = found.setdefault(listed.name, {})
        for listed_container in listed.containers:
            for entry in listed_container.devices:
                held.setdefault(entry.resource_name, []).extend(entry.device_ids)
    return found


@pytest.mark.parametrize("first", [RESOURCE, MEMORY])
def test_list_shows_the_pod_under_admission_with_what_it_got_so_far(
    kubelet: KubeletEmulator, plugins: Plugins, first: str
) -> None:
    """Kubelet adds a pod to its pod manager before admitting it and records each resource's
    devices when that resource's Allocate returns: the second Allocate of a container can see,
    through List, which pod it is for."""
    numbers = plugins.serve(gpus(2), RESOURCE, preferred_available=False)
    memory = plugins.serve([device(f"MEM-{index}") for index in range(4)], MEMORY, preferred_available=False)
    assert kubelet.admit(pod("earlier", containers=[container("main", {RESOURCE: 1})])).admitted
    seen: dict[str, dict[str, dict[str, list[str]]]] = {}
    with lister(kubelet) as stub:
        for plugin, resource in ((numbers, RESOURCE), (memory, MEMORY)):
            plugin.during_allocate = lambda resource=resource: seen.update({resource: listed_devices(stub)})
        spec = pod("admitting", containers=[container("main", {RESOURCE: 1, MEMORY: 2})])
        assert kubelet.admit(spec, resource_order=[first]).admitted
    second = MEMORY if first == RESOURCE else RESOURCE
    assert seen[first]["admitting"] == {}  # listed from its first Allocate on, with nothing yet
    assert list(seen[second]["admitting"]) == [first]
    assert seen[second]["earlier"] == {RESOURCE: ["GPU-0"]}


def test_a_refused_pod_is_listed_while_admitted_then_never(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    plugin = plugins.serve(gpus(2), preferred_available=False)
    plugin.fail_allocate_from = 1
    during: list[list[str]] = []
    with lister(kubelet) as stub:
        plugin.during_allocate = lambda: during.append(list(listed_devices(stub)))
        assert not kubelet.admit(pod("refused", containers=[container("main", {RESOURCE: 1})])).admitted
        assert listed_devices(stub) == {}
    assert during == [["refused"]]


# --------------------------------------------------------------------------- rate limit


def test_kubelets_rate_limit_is_the_default() -> None:
    assert (POD_RESOURCES_QPS, POD_RESOURCES_BURST) == (100.0, 10)
    now = [0.0]
    bucket = TokenBucket(POD_RESOURCES_QPS, POD_RESOURCES_BURST, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(11)] == [True] * 10 + [False]
    now[0] += 0.01  # one token back at 100 per second
    assert [bucket.allow(), bucket.allow()] == [True, False]
    now[0] += 60.0  # never more than the burst
    assert [bucket.allow() for _ in range(11)] == [True] * 10 + [False]


def test_eleventh_immediate_call_is_rejected(root: Path) -> None:
    # A trickle of a rate keeps the burst from refilling while the test runs.
    with emulator(root, pod_resources_qps=0.001) as kubelet, lister(kubelet) as stub:
        for _ in range(5):
            stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
            stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as error:
            stub.Get(pr.GetPodResourcesRequest(pod_name="any", pod_namespace="default"), timeout=WAIT_S)
        calls = kubelet.pod_resources_calls
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.value.details() == RATE_LIMITED
    assert calls.by_method == {"List": 5, "GetAllocatableResources": 5, "Get": 1}
    assert (calls.total, calls.rejected) == (11, 1)


def test_the_rate_limit_fault_refuses_list_during_admissions_only(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    plugin = plugins.serve(gpus(2), preferred_available=False)
    kubelet.rate_limit_while_admitting = True
    codes: list[grpc.StatusCode] = []
    with lister(kubelet) as stub:

        def try_list() -> None:
            try:
                stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
            except grpc.RpcError as error:
                codes.append(error.code())

        plugin.during_allocate = try_list
        assert kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 1})])).admitted
        assert list(listed_devices(stub)) == ["p"]  # between admissions it answers
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED]


# --------------------------------------------------------------------------- lifecycle


def test_restart_recreates_the_socket_and_keeps_admitted_pods(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    admit_two_pods(kubelet, plugins)
    socket_path = kubelet.pod_resources_socket
    assert socket_path is not None
    inode = socket_path.stat().st_ino

    kubelet.restart()

    assert socket_path.stat().st_ino != inode
    with lister(kubelet) as stub:
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
        allocatable = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=WAIT_S)
    # The checkpoint survives; the devices stay unhealthy until the plugin registers again.
    assert list(listed.pod_resources) == [TRAIN, INFER]
    assert list(allocatable.devices) == []
    assert kubelet.pod_resources_calls.total == 2

    kubelet.stop()
    assert not socket_path.exists() and not kubelet.socket_path.exists()


def test_runner_serves_pod_resources(root: Path) -> None:
    socket_path = root / "pod-resources" / "kubelet.sock"
    code = (
        "import sys; from pathlib import Path; from kubesim.kubelet import run_kubelet; "
        "sys.exit(run_kubelet(Path(sys.argv[1]), pod_resources_socket=Path(sys.argv[2])))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(root / "device-plugins"), str(socket_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        serving = process.stdout.readline().rstrip("\n")
        assert (
            serving == f"serving path={root / 'device-plugins' / 'kubelet.sock'} pod-resources={socket_path}"
        )
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            listed = PodResourcesStub(channel).List(pr.ListPodResourcesRequest(), timeout=WAIT_S)
        assert list(listed.pod_resources) == []
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and rest.splitlines() == ["stopped"]
    assert not socket_path.exists()
