"""Allocate and GetPreferredAllocation for share and number mode, in process against the
API-server emulator over HTTP (pod cache, events, outbox) with a real ledger on disk."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import kubernetes.client
import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import objects
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.kube.podcache import PodCache
from kubesim.apiserver import ApiServerEmulator
from tests.kube.waiting import wait_for
from tests.plugin.rig import GPUS, MEM, NODE, NUM, WAIT_S, Rig, close_rig, envs, fails, ids, make_rig

# --- the documented example ----------------------------------------------------------------


def test_two_1024_mib_pods_on_gpu_0(share: Rig) -> None:
    share.pod("first", [("cuda", 1024)], predicate_time=100)
    share.pod("second", [("cuda", 1024)], predicate_time=200)
    first = share.allocator.allocate(ids(0, 0, 1024))
    second = share.allocator.allocate(ids(0, 1024, 1024))
    for response in (first, second):
        assert envs(response) == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-000",
            "VOLCANO_GPU_ALLOCATED": "1024",
            "VOLCANO_GPU_TOTAL": "10989",
            "VOLCANO_GPU_MEMORY_TOTAL": "10989",
        }
    assert sorted(a.pod_name for a in share.ledger.active()) == ["first", "second"]
    assert [(u.index, u.memory, u.pods) for u in share.ledger.usage_by_gpu()] == [(0, 2048, 2)]
    share.outbox.start()

    def assigned(name: str) -> bool:
        pod = share.apiserver.get("pods", name, "ml") or {}
        return bool(pod.get("metadata", {}).get("annotations", {}).get("volcano.sh/gpu-assigned") == "true")

    assert wait_for(lambda: assigned("first") and assigned("second"), WAIT_S)
    # The pass forgets its entries after its last patch has landed, not with it.
    assert wait_for(lambda: share.ledger.outbox_size() == 0, WAIT_S)


def test_index_strategy(share: Rig) -> None:
    share.allocator.id_strategy = "index"
    share.pod("p", [("cuda", 10)], gpu_index="2")
    assert envs(share.allocator.allocate(ids(2, 0, 10)))["NVIDIA_VISIBLE_DEVICES"] == "2"


# --- resolution ----------------------------------------------------------------------------


def test_pods_are_served_in_the_order_they_were_bound_not_by_predicate_time(share: Rig) -> None:
    """Kubelet admits pods in the order its watch brings their binding; the daemon's watch brings
    them in the same order, whatever `predicate-time` says (Volcano binds asynchronously)."""
    share.pod("bound-first", [("cuda", 100)], predicate_time=300, gpu_index="1")
    share.pod("bound-second", [("cuda", 100)], predicate_time=100, gpu_index="0")
    share.pod("bound-third", [("cuda", 100)], predicate_time=None, gpu_index="2")
    served = [envs(share.allocator.allocate(ids(gpu, 0, 100)))["NVIDIA_VISIBLE_DEVICES"] for gpu in (1, 0, 2)]
    assert served == ["GPU-111", "GPU-000", "GPU-222"]
    assert sorted((a.pod_name, a.gpus[0].index) for a in share.ledger.active()) == [
        ("bound-first", 1),
        ("bound-second", 0),
        ("bound-third", 2),
    ]
    assert share.allocator.stats.mismatches[MEM] == 0
    assert share.allocator.stats.resolved[(MEM, "arrival")] == 2  # no pod-resources socket here


def test_replicas_on_one_gpu_need_no_identification(share: Rig) -> None:
    for n in range(3):
        share.pod(f"replica-{n}", [("cuda", 256)], predicate_time=n, gpu_index="0")
    for n in range(3):
        assert envs(share.allocator.allocate(ids(0, 256 * n, 256)))["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"
    assert share.allocator.stats.resolved == {(MEM, "same-placement"): 2}


def test_a_candidate_that_differs_past_the_first_two_makes_the_choice_an_identification(share: Rig) -> None:
    """Two replicas on GPU 0 and a later pod on GPU 1: the candidates would not all get the same,
    so the first Allocate is an identification (kubelet's records would be asked; here arrival
    decides), not 'same-placement': every candidate of the window is weighed."""
    for n, gpu in enumerate(("0", "0", "1")):
        share.pod(f"pod-{n}", [("cuda", 256)], predicate_time=n, gpu_index=gpu)
    assert envs(share.allocator.allocate(ids(0, 0, 256)))["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"
    assert share.allocator.stats.resolved == {(MEM, "arrival"): 1}


def test_multi_container_pod_is_assigned_after_its_last_gpu_container(share: Rig) -> None:
    share.pod("multi", [("small", 256), ("sidecar", 0), ("big", 1024)])
    share.allocator.allocate(ids(0, 0, 256))
    assert share.ledger.outbox_size() == 0  # not complete yet
    assert envs(share.allocator.allocate(ids(0, 256, 1024)))["VOLCANO_GPU_ALLOCATED"] == "1024"
    assert {a.container for a in share.ledger.active()} == {"small", "big"}
    patches = [e.patch for e in share.ledger.due()]
    assert [p.annotations for p in patches] == [{"volcano.sh/gpu-assigned": "true"}, {"gpu": None}]


def test_init_container_is_served_first(share: Rig) -> None:
    share.pod("with-init", [("app", 1024)], init=[("prepare", 2048)])
    init = share.allocator.allocate(ids(0, 0, 2048))
    app = share.allocator.allocate(ids(0, 0, 1024))  # kubelet reuses the init container's devices
    assert (envs(init)["VOLCANO_GPU_ALLOCATED"], envs(app)["VOLCANO_GPU_ALLOCATED"]) == ("2048", "1024")
    assert {a.container for a in share.ledger.active()} == {"prepare", "app"}


def test_an_app_container_handed_the_init_containers_devices_is_served_not_repeated(number: Rig) -> None:
    """Kubelet gives a finished init container's devices to the pod's next container first: an app
    container asking as many sends the same IDs. It is served in its own right, so the pod is
    complete and the next pod asking one GPU gets its own, not this pod's."""
    number.pod("staged", [("train", 1)], init=[("prepare", 1)], gpu_index="1", resource=NUM)
    number.pod("other", [("train", 1)], gpu_index="2", resource=NUM)
    number.allocator.allocate(["GPU-111"])
    number.allocator.allocate(["GPU-111"])  # the app container, on the init container's device
    assert {"volcano.sh/gpu-assigned": "true"} in [e.patch.annotations for e in number.ledger.due()]
    assert envs(number.allocator.allocate(["GPU-222"]))["NVIDIA_VISIBLE_DEVICES"] == "GPU-222"
    assert sorted((a.pod_name, a.container) for a in number.ledger.active()) == [
        ("other", "train"),
        ("staged", "prepare"),
        ("staged", "train"),
    ]


def test_deleted_foreign_and_assigned_pods_are_not_candidates(share: Rig) -> None:
    gone = share.pod("gone", [("c", 64)], predicate_time=1)
    as_a_user = kubernetes.client.CoreV1Api(share.kube.client)
    as_a_user.delete_namespaced_pod("gone", "ml", grace_period_seconds=0)
    assert share.pods.wait_until(lambda c: c.get(gone["metadata"]["uid"]) is None, WAIT_S)
    share.pod("eligible", [("c", 64)], predicate_time=2)
    share.pod("elsewhere", [("c", 64)], predicate_time=0, node="node-b")
    share.pod("assigned", [("c", 64)], predicate_time=0, extra={"volcano.sh/gpu-assigned": "true"})
    share.pod("right", [("c", 64)], predicate_time=5)
    response = share.allocator.allocate(ids(0, 0, 64))
    assert envs(response)["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"
    (served,) = share.ledger.active()
    assert served.pod_name == "eligible"  # earliest predicate-time among eligible pods


def test_terminating_pod_is_skipped(tmp_path: Path) -> None:
    with ApiServerEmulator(graceful_pod_deletion=True) as server:
        rig = make_rig(tmp_path, server, "share")
        try:
            rig.pod("leaving", [("c", 64)], predicate_time=1)
            as_a_user = kubernetes.client.CoreV1Api(rig.kube.client)
            as_a_user.delete_namespaced_pod("leaving", "ml")  # graceful: stays, terminating

            def terminating(cache: PodCache) -> bool:
                return any(bool(p["metadata"].get("deletionTimestamp")) for p in cache.pods())

            assert rig.pods.wait_until(terminating, WAIT_S)
            rig.pod("staying", [("c", 64)], predicate_time=2)
            rig.allocator.allocate(ids(0, 0, 64))
            assert [a.pod_name for a in rig.ledger.active()] == ["staying"]
        finally:
            close_rig(rig)


def test_a_pod_arriving_during_the_wait_is_served(share: Rig) -> None:
    share.allocator.timeout_s = 60.0  # far longer than the test: the pod comes during the wait
    served: list[pb.ContainerAllocateResponse] = []
    call = threading.Thread(target=lambda: served.append(share.allocator.allocate(ids(0, 0, 32))))
    call.start()
    assert wait_for(lambda: share.allocator.stats.waiting() == {MEM: 1}, WAIT_S)
    share.pod("late-comer", [("c", 32)])
    call.join()
    assert len(served) == 1
    assert [a.pod_name for a in share.ledger.active()] == ["late-comer"]


# --- repeats, parallelism, no API calls ----------------------------------------------------


def test_a_repeated_allocate_returns_the_same_response(share: Rig) -> None:
    share.pod("p", [("c", 100)])
    first = share.allocator.allocate(ids(0, 0, 100))
    again = share.allocator.allocate(list(reversed(ids(0, 0, 100))))
    assert again == first
    assert len(share.ledger.active()) == 1
    assert share.allocator.stats.outcomes[(MEM, "repeat")] == 1


def test_parallel_allocates_never_serve_a_pod_twice(share: Rig) -> None:
    for n in range(16):
        share.pod(f"p{n:02d}", [("c", 100)], predicate_time=n, gpu_index=str(n % 3))
    results: dict[int, dict[str, str]] = {}

    def call(n: int) -> None:
        results[n] = envs(share.allocator.allocate(ids(n % 3, (n // 3) * 100, 100)))

    threads = [threading.Thread(target=call, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    active = share.ledger.active()
    assert len(active) == 16 and len({a.pod_uid for a in active}) == 16
    assert sorted(r["NVIDIA_VISIBLE_DEVICES"] for r in results.values()) == sorted(
        GPUS[n % 3].uuid for n in range(16)
    )  # every scheduled GPU handed out exactly as often as the scheduler placed pods on it


def test_no_api_request_while_serving_from_the_cache(share: Rig) -> None:
    for n in range(20):
        share.pod(f"p{n}", [("c", 10)], predicate_time=n)
    before = share.apiserver.requests.count()
    for n in range(20):
        share.allocator.allocate(ids(0, n * 10, 10))
    assert share.apiserver.requests.count() == before


# --- number mode ---------------------------------------------------------------------------


def number_envs(visible: str, allocated: int) -> dict[str, str]:
    """volcano-sh/devices' number-mode envs for one container (every rig GPU has 10989 MiB)."""
    total = str(GPUS[0].memory_mib)
    return {
        "NVIDIA_VISIBLE_DEVICES": visible,
        "VOLCANO_GPU_ALLOCATED": str(allocated),
        "VOLCANO_GPU_MEMORY_TOTAL": total,
        "VOLCANO_GPU_TOTAL": total,
    }


def test_number_mode_gives_each_container_its_slice(number: Rig) -> None:
    """Upstream shows every container the pod's whole gpu-index; here each sees only its own
    GPUs, and VOLCANO_GPU_ALLOCATED counts them."""
    number.pod("two", [("a", 1), ("b", 2)], gpu_index="2,0,1", resource=NUM)
    first = number.allocator.allocate(["GPU-222"])
    second = number.allocator.allocate(["GPU-000", "GPU-111"])
    assert envs(first) == number_envs("GPU-222", 1)
    assert envs(second) == number_envs("GPU-000,GPU-111", 2)


def test_number_mode_two_containers_of_two_gpus_each_get_their_own_pair(
    tmp_path: Path, apiserver: ApiServerEmulator
) -> None:
    """The second app container's GPUs start after all of the first one's, not after one of them:
    each container of 2 sees the 2 gpu-index entries that are its own, and the 4 GPUs are held once."""
    four = (*GPUS, GpuInfo(index=3, uuid="GPU-333", model="Fake GPU", memory_mib=GPUS[0].memory_mib))
    rig = make_rig(tmp_path, apiserver, "number", gpus=four)
    try:
        rig.pod("pairs", [("a", 2), ("b", 2)], gpu_index="3,1,0,2", resource=NUM)
        first = rig.allocator.allocate(["GPU-333", "GPU-111"])
        second = rig.allocator.allocate(["GPU-000", "GPU-222"])
        assert envs(first) == number_envs("GPU-333,GPU-111", 2)
        assert envs(second) == number_envs("GPU-000,GPU-222", 2)
        assert [(u.index, u.pods) for u in rig.ledger.usage_by_gpu()] == [(0, 1), (1, 1), (2, 1), (3, 1)]
        assert rig.allocator.stats.mismatches[NUM] == 0  # kubelet's IDs were the scheduler's GPUs
    finally:
        close_rig(rig)


def test_number_mode_without_gpu_index_uses_kubelets_gpus(number: Rig) -> None:
    number.pod("default-scheduled", [("a", 2)], gpu_index=None, predicate_time=None, resource=NUM)
    response = number.allocator.allocate(["GPU-111", "GPU-222"])
    assert envs(response) == number_envs("GPU-111,GPU-222", 2)
    assert number.allocator.stats.mismatches[NUM] == 0


def test_preferred_steers_onto_the_scheduled_gpus(share: Rig) -> None:
    share.pod("p", [("c", 3)], gpu_index="1")
    request = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["0-0", "0-1", "2-5", "1-7", "1-8", "1-9"],
        must_include_deviceIDs=["0-1"],
        allocation_size=3,
    )
    assert share.allocator.preferred(request) == ["0-1", "1-7", "1-8"]


def test_preferred_number_mode(number: Rig) -> None:
    number.pod("p", [("a", 2)], gpu_index="2,1", resource=NUM)
    request = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["GPU-000", "GPU-111", "GPU-222"], allocation_size=2
    )
    assert sorted(number.allocator.preferred(request)) == ["GPU-111", "GPU-222"]


def test_a_share_request_of_exactly_the_cards_memory_is_served(share: Rig) -> None:
    """Volcano places a gpu-memory pod on a card whose free memory is at least the request, so a
    request of the whole card (10989 MiB of 10989) is placed, and must be served, not refused."""
    share.pod("whole", [("c", GPUS[1].memory_mib)], gpu_index="1")
    response = share.allocator.allocate(ids(1, 0, GPUS[1].memory_mib))
    assert envs(response)["NVIDIA_VISIBLE_DEVICES"] == "GPU-111"
    assert envs(response)["VOLCANO_GPU_ALLOCATED"] == "10989"
    assert [(u.index, u.memory) for u in share.ledger.usage_by_gpu()] == [(1, 10989)]


def test_mismatched_ids_are_served_as_scheduled_and_reported(share: Rig) -> None:
    share.pod("p", [("c", 8)], gpu_index="0")
    response = share.allocator.allocate(ids(1, 0, 8))
    assert envs(response)["NVIDIA_VISIBLE_DEVICES"] == "GPU-000"
    assert share.allocator.stats.mismatches[MEM] == 1
    (event,) = share.events_about("p")
    assert event["reason"] == "GpuIdsMismatch"


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "units", "code", "fragments"),
    [
        (
            {"volcano.sh/predicate-time": "yesterday"},
            8,
            grpc.StatusCode.INVALID_ARGUMENT,
            ("pod ml/bad container 'c'", "predicate-time 'yesterday' is not a number"),
        ),
        (
            {"volcano.sh/gpu-index": "zero"},
            8,
            grpc.StatusCode.INVALID_ARGUMENT,
            ("pod ml/bad container 'c'", "volcano.sh/gpu-index", "'zero' is not a GPU index"),
        ),
        (  # issue 13 F1: past int()'s 4,300 digits, this killed the pod cache
            {"volcano.sh/predicate-time": "9" * 4301},
            8,
            grpc.StatusCode.INVALID_ARGUMENT,
            ("pod ml/bad container 'c'", "predicate-time has 4301 digits; a Unix time in nanoseconds"),
        ),
        (
            {"volcano.sh/gpu-index": "9" * 4301},
            8,
            grpc.StatusCode.INVALID_ARGUMENT,
            ("pod ml/bad container 'c'", "gpu-index", "has 4301 digits; a GPU index has at most 19"),
        ),
        (
            {"volcano.sh/gpu-index": "7"},
            8,
            grpc.StatusCode.FAILED_PRECONDITION,
            ("pod ml/bad container 'c'", "names GPU 7, which node node-a does not have (it has 0, 1, 2)"),
        ),
        (
            {"volcano.sh/gpu-index": "0,1"},
            8,
            grpc.StatusCode.INVALID_ARGUMENT,
            ("lists 2 GPUs; a gpu-memory pod lives on one",),
        ),
        ({}, 11000, grpc.StatusCode.INVALID_ARGUMENT, ("asks for 11000 MiB; GPU 0 has 10989 MiB",)),
    ],
)
def test_malformed_pods_are_refused_with_an_event(
    share: Rig, annotations: dict[str, str], units: int, code: grpc.StatusCode, fragments: tuple[str, ...]
) -> None:
    share.pod(
        "bad",
        [("c", units)],
        gpu_index=None,
        predicate_time=None,
        extra={"volcano.sh/gpu-index": "0", **annotations},
    )
    fails(
        share,
        [f"0-{n}" for n in range(units)] if units <= 10989 else ids(0, 0, 10989) + ids(1, 0, 11),
        code,
        *fragments,
    )
    (event,) = share.events_about("bad")
    assert (event["reason"], event["type"]) == ("GpuAllocationFailed", "Warning")
    assert fragments[0] in event["message"]
    assert share.ledger.active() == []


def test_a_poisoned_pod_costs_only_itself(share: Rig) -> None:
    """Issue 13 F1: a pod whose predicate-time has 4,301 digits (past what int() converts) is
    refused in its turn with the reason, and the pod bound after it is still seen and served."""
    poison = {"volcano.sh/predicate-time": "9" * 4301}
    uid = share.pod("poison", [("c", 8)], gpu_index="0", predicate_time=None, extra=poison)["metadata"]["uid"]
    share.pod("next", [("c", 8)], gpu_index="1")
    fails(share, ids(0, 0, 8), grpc.StatusCode.INVALID_ARGUMENT, "pod ml/poison", "has 4301 digits")
    # Kubelet fails the pod whose Allocate failed; the next one gets its GPU.
    share.apiserver.patch("pods", "poison", {"status": {"phase": "Failed"}}, "ml", subresource="status")
    assert share.pods.wait_until(lambda cache: objects.phase(cache.get(uid) or {}) == "Failed", WAIT_S)
    assert envs(share.allocator.allocate(ids(1, 0, 8)))["NVIDIA_VISIBLE_DEVICES"] == "GPU-111"


def test_unhealthy_gpu_is_refused(share: Rig) -> None:
    share.health.set(("GPU-111",), healthy=False, reason="Xid 79")
    share.pod("p", [("c", 8)], gpu_index="1")
    fails(share, ids(1, 0, 8), grpc.StatusCode.FAILED_PRECONDITION, "GPU 1 (GPU-111), which is unhealthy")


def test_share_mode_needs_the_schedulers_gpu_index(share: Rig) -> None:
    share.pod("default-scheduled", [("c", 8)], gpu_index=None, predicate_time=None)
    fails(
        share,
        ids(0, 0, 8),
        grpc.StatusCode.FAILED_PRECONDITION,
        "pod ml/default-scheduled container 'c': no volcano.sh/gpu-index annotation",
    )


@pytest.mark.parametrize(
    ("device_ids", "fragment"),
    [
        ([], "Allocate named no device IDs"),
        (["0-0", "9-1"], "device IDs 9-1 are not devices of this node"),
        (["0-99999"], "0-99999"),
        (["0-0", "0-1", "0-0"], "device IDs 0-0 are named more than once"),
    ],
)
def test_bad_device_ids(share: Rig, device_ids: list[str], fragment: str) -> None:
    fails(share, device_ids, grpc.StatusCode.INVALID_ARGUMENT, fragment)


def test_no_matching_pod_fails_after_the_wait(share: Rig) -> None:
    share.pod("other-size", [("c", 10)])
    fails(
        share,
        ids(0, 0, 11),
        grpc.StatusCode.FAILED_PRECONDITION,
        "node node-a: no pod bound here has a container waiting for 11 unit(s) of volcano.sh/gpu-memory",
        "(waited 1s; 1 pod(s) on the node)",
    )
    assert share.events_about(NODE)[0]["reason"] == "GpuAllocationFailed"


def test_api_outage_serves_from_the_cache_and_fails_clearly_without_it(share: Rig) -> None:
    share.pod("cached", [("c", 10)])
    share.apiserver.faults.error(503)
    share.apiserver.drop_watches()
    assert share.pods.wait_until(lambda c: not c.synced, WAIT_S)
    share.allocator.allocate(ids(0, 0, 10))  # the cache still holds it
    fails(
        share,
        ids(0, 10, 12),
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "the pod cache has not heard from the API server",
    )
    share.apiserver.faults.clear()
