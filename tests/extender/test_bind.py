"""Bind: the Binding carries exactly the annotations the device plugin reads, atomically with the
node; concurrent binds never promise one GPU's memory twice; failures come back as errors."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from deviceplugin.extender.inventory import pod_uid
from deviceplugin.fit import decode_pod_devices, parse_gpu_index
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Obj,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    gpu_uuid,
    memory_pod,
    share_node,
    vgpu_node,
)

GPUSHARE_KEYS = {"volcano.sh/gpu-index", "volcano.sh/predicate-time"}
VGPU_KEYS = {
    "volcano.sh/vgpu-node",
    "volcano.sh/vgpu-time",
    "volcano.sh/vgpu-ids-new",
    "volcano.sh/devices-to-allocate",
    "volcano.sh/bind-phase",
    "volcano.sh/bind-time",
}


def _stored(apiserver: ApiServerEmulator, name: str) -> Obj:
    pod = apiserver.get("pods", name, "default")
    assert pod is not None
    return pod


def test_share_bind_writes_gpu_index_and_predicate_time_with_the_node(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=2, memory=16000))
    create_pod(apiserver, memory_pod("tenant", 10000, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 8000, annotations={"team": "a"}))
    before = time.time_ns()

    assert ext.client.bind(pod, "n1") == ""

    bound = _stored(apiserver, "new")
    assert bound["spec"]["nodeName"] == "n1"
    notes = bound["metadata"]["annotations"]
    assert set(notes) == GPUSHARE_KEYS | {"team"}
    assert notes["volcano.sh/gpu-index"] == "1"  # GPU 0 has only 6000 left
    assert before <= int(notes["volcano.sh/predicate-time"]) <= time.time_ns()


def test_number_bind_names_whole_idle_gpus(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=4, memory_resource=False))
    create_pod(
        apiserver,
        gpu_pod(
            "tenant", {"volcano.sh/gpu-number": "1"}, node="n1", annotations={"volcano.sh/gpu-index": "1"}
        ),
    )
    ext = start_extender(strategy="number")
    pod = create_pod(apiserver, gpu_pod("new", {"volcano.sh/gpu-number": "2"}))
    assert ext.client.bind(pod, "n1") == ""
    notes = _stored(apiserver, "new")["metadata"]["annotations"]
    assert set(notes) == GPUSHARE_KEYS
    assert notes["volcano.sh/gpu-index"] == "0,2"


def test_vgpu_bind_writes_the_six_annotations(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", vgpu_node("n1", gpus=2, memory=16000))
    ext = start_extender(strategy="vgpu", policy="spread")
    limits = {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "3000", "volcano.sh/vgpu-cores": "25"}
    pod = create_pod(apiserver, gpu_pod("new", limits))
    before = int(time.time())

    assert ext.client.bind(pod, "n1") == ""

    bound = _stored(apiserver, "new")
    notes = bound["metadata"]["annotations"]
    assert bound["spec"]["nodeName"] == "n1"
    assert set(notes) == VGPU_KEYS
    expected = f"{gpu_uuid('n1', 0)},NVIDIA,3000,25:{gpu_uuid('n1', 1)},NVIDIA,3000,25:"
    assert notes["volcano.sh/vgpu-ids-new"] == notes["volcano.sh/devices-to-allocate"] == expected
    assert notes["volcano.sh/vgpu-node"] == "n1"
    assert notes["volcano.sh/bind-phase"] == "allocating"
    assert before <= int(notes["volcano.sh/vgpu-time"]) == int(notes["volcano.sh/bind-time"]) <= time.time()


def test_a_bind_that_no_longer_fits_is_refused_and_the_pod_stays_pending(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    ext = start_extender(strategy="share")
    first = create_pod(apiserver, memory_pod("first", 10000))
    second = create_pod(apiserver, memory_pod("second", 10000))
    assert ext.client.filter(second, ["n1"])["NodeNames"] == ["n1"]  # both fit, taken one at a time

    assert ext.client.bind(first, "n1") == ""
    error = ext.client.bind(second, "n1")  # the cache may not have seen `first` bound yet

    assert "cannot bind pod default/second to node n1" in error and "6000 of 16000" in error
    assert "nodeName" not in _stored(apiserver, "second")["spec"]


def test_unknown_pods_and_nodes_are_errors(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    ghost = {"metadata": {"name": "ghost", "namespace": "default", "uid": "no-such-uid"}}
    assert "not known to the extender" in ext.client.bind(ghost, "n1")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    assert "not in the extender's node cache" in ext.client.bind(pod, "nowhere")
    replaced = {**pod, "metadata": {**pod["metadata"], "uid": "an-older-uid"}}
    uid = pod["metadata"]["uid"]
    assert f"has uid {uid}, not an-older-uid: it was replaced" in ext.client.bind(replaced, "n1")


def test_a_pod_recreated_under_its_name_before_the_bind_is_not_bound_by_it(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """kube-scheduler binds the pod it filtered (by UID). If that pod was deleted and another made
    under its name meanwhile, the Binding fails (the API server checks the UID) and books nothing:
    the new pod stays pending, and its own bind later gets the whole card."""
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    ext = start_extender(strategy="share")
    old = create_pod(apiserver, memory_pod("job", 4000))
    assert ext.client.filter(old, ["n1"])["NodeNames"] == ["n1"]
    apiserver.delete("pods", "job", "default")
    eventually(lambda: ext.extender.pods.get(pod_uid(old)) is None)
    new = create_pod(apiserver, memory_pod("job", 16000))

    error = ext.client.bind(old, "n1")

    assert "binding pod default/job to node n1 failed" in error
    assert f"UID in precondition: {pod_uid(old)}" in error
    assert "nodeName" not in _stored(apiserver, "job")["spec"]
    assert ext.client.bind(new, "n1") == ""  # nothing of the old pod's 4000 MiB is still booked
    assert _stored(apiserver, "job")["metadata"]["annotations"]["volcano.sh/gpu-index"] == "0"


def test_binding_an_already_bound_pod_is_an_error(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    assert ext.client.bind(pod, "n1") == ""
    eventually(lambda: "already bound to node n1" in ext.client.bind(pod, "n1"))


def test_a_pod_without_gpu_request_is_bound_without_annotations(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, gpu_pod("cpu-job"))
    assert ext.client.bind(pod, "n1") == ""
    stored = _stored(apiserver, "cpu-job")
    assert stored["spec"]["nodeName"] == "n1"
    assert not stored["metadata"].get("annotations")


def test_a_failed_binding_call_releases_what_it_assumed(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 10000))
    apiserver.faults.error(500, path="/binding", times=1)
    assert "failed" in ext.client.bind(pod, "n1")
    assert ext.client.bind(pod, "n1") == ""  # the first attempt's memory was given back


def _bind_all(ext_bind: object, pods: list[Obj], node: str) -> list[str]:
    barrier = threading.Barrier(len(pods))

    def one(pod: Obj) -> str:
        barrier.wait()
        assert callable(ext_bind)
        result: str = ext_bind(pod, node)
        return result

    with ThreadPoolExecutor(len(pods)) as pool:
        return list(pool.map(one, pods))


def test_sixteen_concurrent_share_binds_never_overcommit_a_gpu(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=2, memory=16000))
    ext = start_extender(strategy="share")
    pods = [create_pod(apiserver, memory_pod(f"p{n}", 3000)) for n in range(16)]
    eventually(lambda: all(ext.extender.pods.get(pod_uid(pod)) for pod in pods))

    errors = _bind_all(ext.client.bind, pods, "n1")

    assert errors.count("") == 10  # 5 pods of 3000 fit on each 16000 card
    used = {0: 0, 1: 0}
    for pod in apiserver.list("pods"):
        notes = pod["metadata"].get("annotations") or {}
        if "volcano.sh/gpu-index" in notes:
            for index in parse_gpu_index(notes["volcano.sh/gpu-index"]):
                used[index] += 3000
    assert used == {0: 15000, 1: 15000}
    assert all("cannot bind" in error for error in errors if error)


def test_sixteen_concurrent_vgpu_binds_never_overcommit_a_gpu(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", vgpu_node("n1", gpus=2, memory=16000))
    ext = start_extender(strategy="vgpu", policy="binpack")
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "5000"}
    pods = [create_pod(apiserver, gpu_pod(f"p{n}", limits)) for n in range(16)]
    eventually(lambda: all(ext.extender.pods.get(pod_uid(pod)) for pod in pods))

    errors = _bind_all(ext.client.bind, pods, "n1")

    assert errors.count("") == 6  # 3 pods of 5000 per 16000 card
    used: dict[str, int] = {}
    for pod in apiserver.list("pods"):
        notes = pod["metadata"].get("annotations") or {}
        if "volcano.sh/vgpu-ids-new" in notes:
            for container in decode_pod_devices(notes["volcano.sh/vgpu-ids-new"]):
                for device in container:
                    used[device.uuid] = used.get(device.uuid, 0) + device.memory
    assert used == {gpu_uuid("n1", 0): 15000, gpu_uuid("n1", 1): 15000}
