"""Kubelet emulator, admission side: real gRPC on real Unix sockets against in-test plugins."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import UNHEALTHY
from deviceplugin.api import deviceplugin_pb2 as dp
from kubesim.admission import UNEXPECTED_ADMISSION_ERROR, Admission, AllocationError
from kubesim.kubelet import KubeletEmulator, KubeletEvent
from tests.sim.test_kubelet import WAIT_S, FakePlugin, PluginServer, device, register, settle

pytestmark = pytest.mark.usefixtures("no_leaked_threads")

RESOURCE = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"

Answer = Callable[[dp.ContainerPreferredAllocationRequest], Sequence[str]]


# --------------------------------------------------------------------------- in-test device plugin


class AdmissionPlugin(FakePlugin):
    """A FakePlugin that also answers GetPreferredAllocation and Allocate, as each test sets it up."""

    def __init__(self, *, preferred_available: bool = True) -> None:
        super().__init__()
        self.options = dp.DevicePluginOptions(get_preferred_allocation_available=preferred_available)
        self._calls = threading.Condition()
        self.preferred_requests: list[dp.ContainerPreferredAllocationRequest] = []
        self.allocate_requests: list[dp.AllocateRequest] = []
        #: GetPreferredAllocation's device IDs; None answers with no container response at all.
        self.answer: Answer | None = None
        self.preferred_error: str | None = None
        #: Allocate fails with INTERNAL from this call on (1-based).
        self.fail_allocate_from: int | None = None
        self.empty_response = False
        self.allocate_delay_s = 0.0
        #: When set, every Allocate waits for it.
        self.gate: threading.Event | None = None
        #: When set, every Allocate calls it before answering (to look at kubelet meanwhile).
        self.during_allocate: Callable[[], None] | None = None
        self.in_flight = 0
        self.max_in_flight = 0

    def wait_in_flight(self, count: int) -> bool:
        with self._calls:
            return self._calls.wait_for(lambda: self.in_flight == count, timeout=WAIT_S)

    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        return self.options

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        with self._calls:
            self.preferred_requests.extend(request.container_requests)
        if self.preferred_error is not None:
            context.abort(grpc.StatusCode.INTERNAL, self.preferred_error)
        if self.answer is None:
            return dp.PreferredAllocationResponse()
        answers = [
            dp.ContainerPreferredAllocationResponse(deviceIDs=self.answer(each))
            for each in request.container_requests
        ]
        return dp.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        with self._calls:
            self.allocate_requests.append(request)
            call = len(self.allocate_requests)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._calls.notify_all()
        try:
            if self.gate is not None:
                self.gate.wait(WAIT_S)
            if self.during_allocate is not None:
                self.during_allocate()
            time.sleep(self.allocate_delay_s)
            if self.fail_allocate_from is not None and call >= self.fail_allocate_from:
                context.abort(grpc.StatusCode.INTERNAL, "device exploded")
            if self.empty_response:
                return dp.AllocateResponse()
            responses = [response_for(each.devices_ids, call) for each in request.container_requests]
            return dp.AllocateResponse(container_responses=responses)
        finally:
            with self._calls:
                self.in_flight -= 1
                self._calls.notify_all()

    @property
    def allocated_ids(self) -> list[list[str]]:
        """Device IDs of every Allocate call, in order."""
        return [list(each.devices_ids) for call in self.allocate_requests for each in call.container_requests]


def response_for(device_ids: Sequence[str], call: int) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs={"TEST_DEVICES": ",".join(device_ids), "TEST_CALL": str(call)},
        mounts=[dp.Mount(container_path="/etc/test", host_path=f"/tmp/test-{call}", read_only=True)],
        devices=[dp.DeviceSpec(container_path="/dev/test0", host_path="/dev/test0", permissions="rw")],
        annotations={"test/call": str(call)},
        cdi_devices=[dp.CDIDevice(name=f"test.com/gpu={device_ids[0]}")],
    )


def highest_first(request: dp.ContainerPreferredAllocationRequest) -> list[str]:
    """A plugin preference: the must-include devices, then the highest IDs offered."""
    must = list(request.must_include_deviceIDs)
    rest = sorted(set(request.available_deviceIDs) - set(must), reverse=True)
    return (must + rest)[: request.allocation_size]


class Plugins:
    """AdmissionPlugins served in `kubelet`'s directory and registered with it."""

    def __init__(self, kubelet: KubeletEmulator) -> None:
        self._kubelet = kubelet
        self._servers: list[PluginServer] = []

    def serve(
        self, devices: Sequence[dp.Device], resource: str = RESOURCE, *, preferred_available: bool = True
    ) -> AdmissionPlugin:
        plugin = AdmissionPlugin(preferred_available=preferred_available)
        endpoint = f"p{len(self._servers)}.sock"
        server = PluginServer(self._kubelet.directory, endpoint, plugin)
        server.start()
        self._servers.append(server)
        plugin.publish(devices)
        register(self._kubelet.directory, resource, endpoint)
        settle(self._kubelet, lambda state: state.connected and state.messages == 1, resource)
        return plugin

    def stop(self) -> None:
        for server in self._servers:
            server.stop()


def gpus(count: int, *, unhealthy: Sequence[int] = ()) -> list[dp.Device]:
    return [device(f"GPU-{index}", UNHEALTHY if index in unhealthy else "Healthy") for index in range(count)]


def container(
    name: str, limits: Mapping[str, object] | None = None, *, sidecar: bool = False
) -> dict[str, Any]:
    built: dict[str, Any] = {"name": name, "image": "busybox"}
    if limits is not None:
        built["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    if sidecar:
        built["restartPolicy"] = "Always"
    return built


def pod(
    name: str,
    containers: Sequence[dict[str, Any]],
    init: Sequence[dict[str, Any]] = (),
    namespace: str = "default",
) -> dict[str, Any]:
    # App containers come first in the JSON: kubelet's order must not depend on the key order.
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
    }


@pytest.fixture
def kubelet(root: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(root / "device-plugins", dial_timeout_s=0.5) as emulator:
        yield emulator


@pytest.fixture
def plugins(kubelet: KubeletEmulator) -> Iterator[Plugins]:
    served = Plugins(kubelet)
    yield served
    served.stop()


def refused(message: str) -> str:
    return f"Allocate failed due to {message}, which is unexpected"


def assert_refused(admission: Admission, message: str) -> None:
    assert not admission.admitted
    assert (admission.reason, admission.message) == (UNEXPECTED_ADMISSION_ERROR, refused(message))
    assert admission.allocations == ()


# --------------------------------------------------------------------------- order and scope


def test_init_containers_are_admitted_before_app_containers(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    plugin = plugins.serve(gpus(8), preferred_available=False)
    admission = kubelet.admit(
        pod(
            "ordered",
            containers=[container("app-a", {RESOURCE: 2}), container("app-b", {RESOURCE: "3"})],
            init=[container("init-a", {RESOURCE: 1}), container("init-b", {RESOURCE: 1})],
        )
    )
    assert admission.admitted and not admission.replayed
    assert [(entry.container, entry.resource) for entry in admission.allocations] == [
        ("init-a", RESOURCE),
        ("init-b", RESOURCE),
        ("app-a", RESOURCE),
        ("app-b", RESOURCE),
    ]
    # One Allocate per container, each with exactly one ContainerAllocateRequest, in that order.
    assert [len(call.container_requests) for call in plugin.allocate_requests] == [1, 1, 1, 1]
    assert plugin.allocated_ids == [list(entry.device_ids) for entry in admission.allocations]
    # The second init container runs after the first ended: it reuses the first's device.
    assert admission.allocation("init-b", RESOURCE).device_ids == ("GPU-0",)


def test_containers_without_plugin_resources_make_no_call(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(2))
    limits = {"cpu": "500m", "memory": "1Gi", "example.com/unregistered": 1}
    admission = kubelet.admit(pod("plain", containers=[container("main", limits), container("bare")]))
    assert admission.admitted and admission.allocations == ()
    assert plugin.preferred_requests == [] and plugin.allocate_requests == []
    assert kubelet.admission("uid-plain") == admission


def test_each_resource_of_a_container_is_allocated_by_its_plugin(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    numbers = plugins.serve(gpus(2), RESOURCE, preferred_available=False)
    memory = plugins.serve([device(f"MEM-{index}") for index in range(4)], MEMORY, preferred_available=False)
    both = pod("both", containers=[container("main", {MEMORY: 3, RESOURCE: 1})])
    admission = kubelet.admit(both, resource_order=[RESOURCE])
    assert [(entry.resource, entry.device_ids) for entry in admission.allocations] == [
        (RESOURCE, ("GPU-0",)),
        (MEMORY, ("MEM-0", "MEM-1", "MEM-2")),
    ]
    assert (numbers.allocated_ids, memory.allocated_ids) == ([["GPU-0"]], [["MEM-0", "MEM-1", "MEM-2"]])


def test_a_containers_resources_come_in_go_map_order(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    """Kubelet ranges over `limits`, a Go map: neither resource reliably goes first."""
    plugins.serve(gpus(40), RESOURCE, preferred_available=False)
    plugins.serve([device(f"MEM-{index}") for index in range(40)], MEMORY, preferred_available=False)
    firsts = set()
    for n in range(20):
        limits = {RESOURCE: 1, MEMORY: 1, "cpu": "1"}
        admission = kubelet.admit(pod(f"p{n}", containers=[container("main", limits)]))
        assert sorted(entry.resource for entry in admission.allocations) == sorted([MEMORY, RESOURCE])
        firsts.add(admission.allocations[0].resource)
    assert firsts == {MEMORY, RESOURCE}  # 20 shuffles of two: both orders (seeded, so every run)


def test_allocation_keeps_the_whole_response(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugins.serve(gpus(2), preferred_available=False)
    entry = kubelet.admit(pod("full", containers=[container("main", {RESOURCE: 2})])).allocation(
        "main", RESOURCE
    )
    assert entry.response == response_for(["GPU-0", "GPU-1"], 1)
    assert entry.envs == {"TEST_DEVICES": "GPU-0,GPU-1", "TEST_CALL": "1"}
    assert [(mount.container_path, mount.host_path, mount.read_only) for mount in entry.mounts] == [
        ("/etc/test", "/tmp/test-1", True)
    ]
    assert [(spec.container_path, spec.permissions) for spec in entry.devices] == [("/dev/test0", "rw")]
    assert entry.annotations == {"test/call": "1"}
    assert entry.cdi_devices == ["test.com/gpu=GPU-0"]
    stored = kubelet.admission("uid-full")
    assert stored is not None and stored.find("main", MEMORY) is None
    with pytest.raises(KeyError):
        stored.allocation("main", MEMORY)


# --------------------------------------------------------------------------- GetPreferredAllocation


def test_preference_is_not_asked_unless_advertised(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4), preferred_available=False)
    entry = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 2})])).allocation(
        "main", RESOURCE
    )
    assert plugin.preferred_requests == []
    assert (entry.preferred_called, entry.preferred, entry.preferred_used) == (False, None, False)
    assert entry.device_ids == ("GPU-0", "GPU-1")


def test_preference_is_asked_with_candidates_and_size(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4, unhealthy=[1]))
    plugin.answer = highest_first
    entry = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 2})])).allocation(
        "main", RESOURCE
    )
    (request,) = plugin.preferred_requests
    assert list(request.available_deviceIDs) == ["GPU-0", "GPU-2", "GPU-3"]
    assert list(request.must_include_deviceIDs) == []
    assert request.allocation_size == 2
    assert entry.preferred == ("GPU-3", "GPU-2") and entry.preferred_used
    assert entry.device_ids == ("GPU-3", "GPU-2") and plugin.allocated_ids == [["GPU-3", "GPU-2"]]


def test_preference_is_asked_even_when_every_candidate_is_needed(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    # Without a topology-manager hint kubelet has no "aligned" set and always asks.
    plugin = plugins.serve(gpus(2))
    plugin.answer = highest_first
    entry = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 2})])).allocation(
        "main", RESOURCE
    )
    (request,) = plugin.preferred_requests
    assert (list(request.available_deviceIDs), request.allocation_size) == (["GPU-0", "GPU-1"], 2)
    assert entry.device_ids == ("GPU-1", "GPU-0")


@pytest.mark.parametrize(
    ("answer", "expected", "used"),
    [
        pytest.param(["GPU-2"], ("GPU-2", "GPU-0"), False, id="short-answer-is-topped-up"),
        pytest.param(["GPU-9", "nope"], ("GPU-0", "GPU-1"), False, id="unknown-ids-are-ignored"),
        pytest.param(["GPU-4"], ("GPU-0", "GPU-1"), False, id="unhealthy-id-is-ignored"),
        pytest.param(["GPU-3", "GPU-3"], ("GPU-3", "GPU-0"), False, id="duplicates-count-once"),
        pytest.param(["GPU-3", "GPU-1", "GPU-2"], ("GPU-3", "GPU-1"), True, id="surplus-is-cut"),
        pytest.param(None, ("GPU-0", "GPU-1"), False, id="no-container-response"),
    ],
)
def test_preference_falls_back_to_kubelets_pick(
    kubelet: KubeletEmulator,
    plugins: Plugins,
    answer: list[str] | None,
    expected: tuple[str, ...],
    used: bool,
) -> None:
    plugin = plugins.serve(gpus(5, unhealthy=[4]))
    plugin.answer = None if answer is None else (lambda request: answer)
    entry = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 2})])).allocation(
        "main", RESOURCE
    )
    assert entry.preferred_called and entry.preferred == tuple(answer or ())
    assert (entry.device_ids, entry.preferred_used) == (expected, used)
    assert plugin.allocated_ids == [list(expected)]


def test_preference_naming_another_pods_device_is_ignored(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(3))
    first = kubelet.admit(pod("first", containers=[container("main", {RESOURCE: 1})]))
    assert first.allocation("main", RESOURCE).device_ids == ("GPU-0",)
    plugin.answer = lambda request: ["GPU-0"]
    entry = kubelet.admit(pod("second", containers=[container("main", {RESOURCE: 1})])).allocation(
        "main", RESOURCE
    )
    assert list(plugin.preferred_requests[-1].available_deviceIDs) == ["GPU-1", "GPU-2"]
    assert entry.device_ids == ("GPU-1",) and not entry.preferred_used


def test_failed_preference_call_refuses_the_pod(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    # Kubelet does not fall back when the call itself fails: the pod is rejected.
    plugin = plugins.serve(gpus(2))
    plugin.preferred_error = "no idea"
    admission = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 1})]))
    assert_refused(
        admission,
        "device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Internal desc = no idea",
    )
    assert plugin.allocate_requests == [] and kubelet.in_use(RESOURCE) == {}


# --------------------------------------------------------------------------- reusable init devices


def test_init_devices_are_reused_first_by_the_next_container(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    plugin = plugins.serve(gpus(4))
    plugin.answer = highest_first
    admission = kubelet.admit(
        pod(
            "reuse",
            init=[container("setup", {RESOURCE: 1})],
            containers=[container("main", {RESOURCE: 2}), container("helper", {RESOURCE: 1})],
        )
    )
    assert admission.allocation("setup", RESOURCE).device_ids == ("GPU-3",)
    _, main_request, helper_request = plugin.preferred_requests
    assert list(main_request.must_include_deviceIDs) == ["GPU-3"]
    assert list(main_request.available_deviceIDs) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert main_request.allocation_size == 2
    main = admission.allocation("main", RESOURCE)
    assert main.device_ids == ("GPU-3", "GPU-2") and main.preferred_used
    # An app container keeps what it got: the next one cannot reuse it.
    assert (list(helper_request.must_include_deviceIDs), list(helper_request.available_deviceIDs)) == (
        [],
        ["GPU-0", "GPU-1"],
    )
    assert admission.allocation("helper", RESOURCE).device_ids == ("GPU-1",)
    assert kubelet.in_use(RESOURCE) == dict.fromkeys(["GPU-1", "GPU-2", "GPU-3"], "uid-reuse")


def test_reusable_devices_that_suffice_need_no_preference(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4))
    admission = kubelet.admit(
        pod("enough", init=[container("setup", {RESOURCE: 2})], containers=[container("main", {RESOURCE: 1})])
    )
    assert len(plugin.preferred_requests) == 1  # for the init container only
    assert admission.allocation("main", RESOURCE).device_ids == ("GPU-0",)
    assert not admission.allocation("main", RESOURCE).preferred_called
    assert plugin.allocated_ids == [["GPU-0", "GPU-1"], ["GPU-0"]]


def test_sidecar_keeps_its_devices(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugins.serve(gpus(4), preferred_available=False)
    admission = kubelet.admit(
        pod(
            "sidecar",
            init=[container("proxy", {RESOURCE: 1}, sidecar=True), container("setup", {RESOURCE: 1})],
            containers=[container("main", {RESOURCE: 2})],
        )
    )
    assert admission.allocation("proxy", RESOURCE).device_ids == ("GPU-0",)
    assert admission.allocation("setup", RESOURCE).device_ids == ("GPU-1",)
    # The run-to-completion init container's device is reused; the sidecar's is not.
    assert admission.allocation("main", RESOURCE).device_ids == ("GPU-1", "GPU-2")


def test_sidecar_after_an_init_container_reuses_its_devices(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    plugins.serve(gpus(4), preferred_available=False)
    admission = kubelet.admit(
        pod(
            "late-sidecar",
            init=[container("setup", {RESOURCE: 1}), container("proxy", {RESOURCE: 1}, sidecar=True)],
            containers=[container("main", {RESOURCE: 1})],
        )
    )
    # The sidecar starts after setup ended, takes its device and keeps it from main.
    assert [entry.device_ids for entry in admission.allocations] == [("GPU-0",), ("GPU-0",), ("GPU-1",)]


# --------------------------------------------------------------------------- refusals


def test_allocate_error_refuses_the_pod_and_frees_its_devices(
    kubelet: KubeletEmulator, plugins: Plugins
) -> None:
    plugin = plugins.serve(gpus(3), preferred_available=False)
    plugin.fail_allocate_from = 2
    admission = kubelet.admit(
        pod("broken", init=[container("setup", {RESOURCE: 1})], containers=[container("main", {RESOURCE: 2})])
    )
    assert_refused(admission, "rpc error: code = Internal desc = device exploded")
    assert len(plugin.allocate_requests) == 2
    assert kubelet.in_use(RESOURCE) == {} and kubelet.admissions == ()
    plugin.fail_allocate_from = None
    fine = kubelet.admit(pod("fine", containers=[container("main", {RESOURCE: 3})]))
    assert fine.allocation("main", RESOURCE).device_ids == ("GPU-0", "GPU-1", "GPU-2")


def test_empty_allocate_response_refuses_the_pod(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(2), preferred_available=False)
    plugin.empty_response = True
    admission = kubelet.admit(pod("empty", containers=[container("main", {RESOURCE: 1})]))
    # Kubelet prints the empty response with Go's %v, which renders as nothing.
    assert_refused(admission, "no containers return in allocation response ")
    assert kubelet.in_use(RESOURCE) == {}


def test_out_of_devices_is_refused_without_a_call(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(3, unhealthy=[2]))
    assert kubelet.admit(pod("big", containers=[container("main", {RESOURCE: 2})])).admitted
    calls = (len(plugin.preferred_requests), len(plugin.allocate_requests))
    admission = kubelet.admit(pod("late", containers=[container("main", {RESOURCE: 1})]))
    assert_refused(
        admission, f"requested number of devices unavailable for {RESOURCE}. Requested: 1, Available: 0"
    )
    too_many = kubelet.admit(pod("huge", containers=[container("main", {RESOURCE: 5})]))
    assert too_many.message == refused(
        f"requested number of devices unavailable for {RESOURCE}. Requested: 5, Available: 0"
    )
    assert (len(plugin.preferred_requests), len(plugin.allocate_requests)) == calls


def test_no_healthy_devices_is_refused(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(2, unhealthy=[0, 1]))
    admission = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 1})]))
    assert_refused(admission, f"no healthy devices present; cannot allocate unhealthy devices {RESOURCE}")
    assert plugin.allocate_requests == []


def test_disconnected_plugin_has_no_healthy_devices(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(2))
    plugins.stop()
    settle(kubelet, lambda state: not state.connected, RESOURCE)
    admission = kubelet.admit(pod("p", containers=[container("main", {RESOURCE: 1})]))
    assert_refused(admission, f"no healthy devices present; cannot allocate unhealthy devices {RESOURCE}")
    assert plugin.allocate_requests == []


# --------------------------------------------------------------------------- the checkpoint


def test_devices_in_use_are_not_offered_until_released(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4))
    first = kubelet.admit(pod("first", containers=[container("main", {RESOURCE: 2})]))
    second = kubelet.admit(pod("second", containers=[container("main", {RESOURCE: 1})]))
    assert list(plugin.preferred_requests[1].available_deviceIDs) == ["GPU-2", "GPU-3"]
    assert first.devices_of(RESOURCE) == {"GPU-0", "GPU-1"}
    assert second.devices_of(RESOURCE) == {"GPU-2"}
    assert kubelet.in_use(RESOURCE) == {"GPU-0": "uid-first", "GPU-1": "uid-first", "GPU-2": "uid-second"}
    assert [admission.pod.name for admission in kubelet.admissions] == ["first", "second"]

    assert kubelet.release("uid-first") and not kubelet.release("uid-first")
    assert kubelet.in_use(RESOURCE) == {"GPU-2": "uid-second"}
    third = kubelet.admit(pod("third", containers=[container("main", {RESOURCE: 3})]))
    assert third.devices_of(RESOURCE) == {"GPU-0", "GPU-1", "GPU-3"}


def test_a_batch_is_admitted_in_creation_order(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4), preferred_available=False)
    made = {"c": "2024-05-01T10:00:02Z", "a": "2024-05-01T10:00:00Z", "b": "2024-05-01T10:00:01Z"}
    batch = [pod(name, containers=[container("main", {RESOURCE: 1})]) for name in ("c", "b", "a")]
    for spec in batch:
        spec["metadata"]["creationTimestamp"] = made[spec["metadata"]["name"]]
    admitted = kubelet.admit_batch(batch)
    assert [admission.pod.name for admission in admitted] == ["a", "b", "c"]
    assert plugin.allocated_ids == [["GPU-0"], ["GPU-1"], ["GPU-2"]]
    assert [admission.pod.name for admission in kubelet.admissions] == ["a", "b", "c"]


def test_admitting_again_replays_the_checkpoint(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4))
    spec = pod(
        "again", init=[container("setup", {RESOURCE: 1})], containers=[container("main", {RESOURCE: 2})]
    )
    first = kubelet.admit(spec)
    calls = (len(plugin.preferred_requests), len(plugin.allocate_requests))
    again = kubelet.admit(spec)
    assert again.admitted and again.replayed
    assert again.allocations == first.allocations
    assert (len(plugin.preferred_requests), len(plugin.allocate_requests)) == calls
    assert kubelet.admission("uid-again") == first


def test_replay_checks_the_devices_are_still_healthy(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(3), preferred_available=False)
    spec = pod("fragile", containers=[container("main", {RESOURCE: 1})])
    assert kubelet.admit(spec).admitted
    plugin.publish(gpus(3, unhealthy=[0]))
    settle(kubelet, lambda state: state.messages == 2, RESOURCE)
    assert_refused(
        kubelet.admit(spec),
        f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {RESOURCE}",
    )
    assert kubelet.admission("uid-fragile") is None and len(plugin.allocate_requests) == 1


def test_changed_request_is_refused_on_replay(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugins.serve(gpus(3))
    assert kubelet.admit(pod("grow", containers=[container("main", {RESOURCE: 1})])).admitted
    admission = kubelet.admit(pod("grow", containers=[container("main", {RESOURCE: 2})]))
    assert_refused(
        admission, f'pod "uid-grow" container "main" changed request for resource "{RESOURCE}" from 1 to 2'
    )


def test_reallocate_sends_the_checkpointed_ids_again(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(4))
    plugin.answer = highest_first
    first = kubelet.admit(pod("idem", containers=[container("main", {RESOURCE: 2})]))
    response = kubelet.reallocate("uid-idem", "main", RESOURCE)
    assert plugin.allocated_ids == [["GPU-3", "GPU-2"], ["GPU-3", "GPU-2"]]
    assert len(plugin.preferred_requests) == 1
    assert response == response_for(["GPU-3", "GPU-2"], 2)
    stored = kubelet.admission("uid-idem")
    assert stored is not None and stored.allocation("main", RESOURCE).response == response
    assert stored.allocation("main", RESOURCE).device_ids == first.allocation("main", RESOURCE).device_ids

    plugin.fail_allocate_from = 3
    with pytest.raises(AllocationError, match="device exploded"):
        kubelet.reallocate("uid-idem", "main", RESOURCE)
    with pytest.raises(KeyError):
        kubelet.reallocate("uid-nobody", "main", RESOURCE)


# --------------------------------------------------------------------------- concurrency and events


def test_concurrent_admissions_run_one_at_a_time(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(8))
    plugin.allocate_delay_s = 0.02
    specs = [pod(f"p{index}", containers=[container("main", {RESOURCE: 1})]) for index in range(6)]
    with futures.ThreadPoolExecutor(len(specs)) as pool:
        admissions = list(pool.map(kubelet.admit, specs))
    assert all(admission.admitted for admission in admissions)
    assert plugin.max_in_flight == 1 and len(plugin.allocate_requests) == 6
    assert len(set(kubelet.in_use(RESOURCE))) == 6


def test_state_stays_readable_while_the_plugin_is_called(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(2))
    plugin.gate = threading.Event()
    with futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(kubelet.admit, pod("slow", containers=[container("main", {RESOURCE: 1})]))
        try:
            assert plugin.wait_in_flight(1)
            # ListAndWatch updates, snapshots and the checkpoint all work while Allocate hangs.
            plugin.publish(gpus(3))
            settle(kubelet, lambda state: state.messages == 2 and state.allocatable == 3, RESOURCE)
            assert kubelet.in_use(RESOURCE) == {} and kubelet.admissions == ()
        finally:
            plugin.gate.set()
        assert pending.result(WAIT_S).admitted


def test_restart_cancels_a_hanging_allocate(kubelet: KubeletEmulator, plugins: Plugins) -> None:
    plugin = plugins.serve(gpus(2))
    plugin.gate = threading.Event()
    with futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(kubelet.admit, pod("stuck", containers=[container("main", {RESOURCE: 1})]))
        try:
            assert plugin.wait_in_flight(1)
            kubelet.restart()
            admission = pending.result(WAIT_S)
        finally:
            plugin.gate.set()
    assert_refused(admission, "rpc error: code = Cancelled desc = Channel closed!")
    assert kubelet.in_use(RESOURCE) == {}


def test_listener_sees_admissions_and_releases(root: Path) -> None:
    events: list[KubeletEvent] = []
    with KubeletEmulator(root / "device-plugins", listener=events.append) as emulator:
        served = Plugins(emulator)
        try:
            served.serve(gpus(2), preferred_available=False)
            emulator.admit(pod("ok", containers=[container("main", {RESOURCE: 2})]))
            emulator.admit(pod("ok", containers=[container("main", {RESOURCE: 2})]))
            emulator.admit(pod("no", namespace="team", containers=[container("main", {RESOURCE: 1})]))
            emulator.release("uid-ok")
        finally:
            served.stop()
    lines = [str(event) for event in events if event.kind in {"admitted", "admission-failed", "released"}]
    assert lines == [
        f"admitted pod=default/ok uid=uid-ok main:{RESOURCE}=2",
        f"admitted pod=default/ok uid=uid-ok main:{RESOURCE}=2 replayed",
        f"admission-failed pod=team/no uid=uid-no reason={UNEXPECTED_ADMISSION_ERROR} message="
        + repr(
            refused(f"requested number of devices unavailable for {RESOURCE}. Requested: 1, Available: 0")
        ),
        "released pod=default/ok uid=uid-ok",
    ]


def test_pod_without_uid_is_rejected_as_malformed(kubelet: KubeletEmulator) -> None:
    spec = pod("anon", containers=[container("main")])
    del spec["metadata"]["uid"]
    with pytest.raises(ValueError, match=r"metadata\.uid"):
        kubelet.admit(spec)
