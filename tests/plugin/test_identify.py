"""Telling apart pods that ask the same count, against the kubelet emulator's pod-resources socket."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.ledger import Allocation, Key, Ledger
from deviceplugin.plugin import identify
from deviceplugin.plugin.identify import LISTING_REUSE_S, Identifier
from deviceplugin.plugin.pending import ContainerNeed, PendingPod
from deviceplugin.plugin.vgpu import VgpuAllocator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import eventually
from tests.plugin.rig import GPUS, Rig, envs
from tests.plugin.test_vgpu_allocate import memory, memory_ids, vpod  # noqa: F401 (a fixture)
from tests.sim.test_kubelet_admission import Plugins, container, gpus
from tests.sim.test_kubelet_admission import pod as kube_pod

MEM = "volcano.sh/gpu-memory"
NUMBER = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"


def candidate(name: str) -> tuple[PendingPod, ContainerNeed]:
    need = ContainerNeed("main", False, 10)
    pod = PendingPod(f"uid-{name}", "ml", name, (need,), ((f"uid-{name}", "main", MEM),), (name,))
    return pod, need


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as emulator:
        yield emulator


def admitted(kubelet: KubeletEmulator, name: str) -> None:
    """A pod in kubelet's records (no device of any plugin: listed with nothing held)."""
    pod = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "main"}]},
    }
    assert kubelet.admit(pod).admitted


def test_kubelets_record_finds_the_pod_past_the_first_few(kubelet: KubeletEmulator) -> None:
    assert kubelet.pod_resources_socket is not None
    counts: Counter[tuple[str, str]] = Counter()
    identifier = Identifier(MEM, kubelet.pod_resources_socket, counts)
    admitted(kubelet, "late")  # kubelet lists it: the pod under admission, devices still to come
    first = [candidate("a"), candidate("b")]
    chosen, sure = identifier.pick(
        first, frozenset(), time.monotonic() + 5, distinct=True, keep=False, more=lambda: [candidate("late")]
    )
    assert (chosen[0].name, sure) == ("late", True)
    assert counts == {(MEM, "pod-resources"): 1}


def test_without_pod_resources_the_ledger_then_arrival_decide(tmp_path: Path) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    identifier = Identifier(MEM, tmp_path / "no-kubelet.sock", counts)
    first = [candidate("a"), candidate("b")]
    deadline = time.monotonic() + 5
    sibling = frozenset({("uid-b", "main")})  # b's container was served for another resource
    assert identifier.pick(first, sibling, deadline, distinct=True, keep=False)[0][0].name == "b"
    chosen, sure = identifier.pick(first, frozenset(), deadline, distinct=True, keep=False)
    assert (chosen[0].name, sure) == ("a", False)
    assert counts == {(MEM, "ledger"): 1, (MEM, "arrival"): 1}


def chosen_by_ledger(path: Path, served: set[Key], later: list[str]) -> tuple[str, str]:
    """Without kubelet's records, a ledger at `path` holding the `served` rows: the name picked
    among a, b (then `later`) and what decided."""
    ledger = Ledger(path)
    for uid, name, resource in served:
        ledger.record(Allocation(uid, "ml", uid, name, resource, (), (f"{uid}-{name}",), b""))
    counts: Counter[tuple[str, str]] = Counter()
    identifier = Identifier(MEM, None, counts)
    picked, _ = identifier.pick(
        [candidate("a"), candidate("b")],
        ledger.containers_held_except(MEM),
        time.monotonic() + 5,
        distinct=True,
        keep=False,
        more=lambda: [candidate(name) for name in later],
    )
    ((_, signal),) = counts
    ledger.close()
    return picked[0].name, signal


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        ({("uid-d", "main", NUMBER)}, ("d", "ledger")),  # past the first few, another resource's row
        ({("uid-d", "main", NUMBER), ("uid-b", "main", MEMORY)}, ("b", "ledger")),  # the first few first
        ({("uid-b", "main", NUMBER), ("uid-a", "main", MEMORY)}, ("a", "ledger")),  # the earliest of them
        ({("uid-c", "main", MEM), ("uid-d", "main", MEM)}, ("a", "arrival")),  # this resource's rows
        ({("uid-d", "sidecar", NUMBER)}, ("a", "arrival")),  # another container of the pod
        ({("uid-x", "main", NUMBER)}, ("a", "arrival")),  # a pod that is no candidate
        (set(), ("a", "arrival")),  # a node whose ledger holds no other resource (share, number)
    ],
)
def test_the_ledger_points_at_a_container_served_for_another_resource_only(
    tmp_path: Path, served: set[Key], expected: tuple[str, str]
) -> None:
    """Whether or not the later candidates are walked for the ledger's signal (they are not when no
    other resource holds a row), a container served for another resource is the one, wherever it
    ranks, and nothing else is."""
    assert chosen_by_ledger(tmp_path / "ledger.db", served, ["c", "d"]) == expected


def test_on_a_vgpu_node_the_number_allocate_goes_to_the_container_whose_memory_was_served(
    vgpu: Rig, request: pytest.FixtureRequest
) -> None:
    """Kubelet allocated the last pod's vgpu-memory first (its count told it apart); its
    vgpu-number Allocate, asking as many as eight earlier pods, is that container's too, though
    it ranks past the first few and kubelet's records are not read."""
    memory_plugin: VgpuAllocator = request.getfixturevalue("memory")
    gpu0, _, gpu2 = (gpu.uuid for gpu in GPUS)
    for n in range(9):
        vpod(vgpu, f"early-{n}", [("cuda", [(gpu0, 1024, 0)])], vgpu_time=n)
    late = vpod(vgpu, "late", [("cuda", [(gpu2, 700, 0)])], vgpu_time=9)
    assert memory_plugin.allocate(memory_ids(gpu2, 700)) == pb.ContainerAllocateResponse()
    assert envs(vgpu.allocator.allocate([f"{gpu0}-0"]))["NVIDIA_VISIBLE_DEVICES"] == gpu2
    assert {(a.pod_uid, a.resource) for a in vgpu.ledger.active()} == {
        (late["metadata"]["uid"], NUMBER),
        (late["metadata"]["uid"], MEMORY),
    }
    assert vgpu.allocator.stats.resolved == {(NUMBER, "ledger"): 1}


# --- what kubelet's records say (plugins serving both vGPU resources to the kubelet emulator) ---


@pytest.fixture
def plugins(kubelet: KubeletEmulator) -> Iterator[Plugins]:
    served = Plugins(kubelet)
    served.serve(gpus(4), NUMBER)
    served.serve(gpus(4), MEMORY)
    yield served
    served.stop()


def holding(kubelet: KubeletEmulator, name: str, **limits: int) -> None:
    """Kubelet admitted the pod: its container holds devices of each resource it limits."""
    resources = {f"volcano.sh/vgpu-{resource}": str(units) for resource, units in limits.items()}
    assert kubelet.admit(kube_pod(name, [container("main", resources)], namespace="ml")).admitted


def choose(identifier: Identifier, names: list[str], **options: object) -> tuple[str, bool]:
    picked, sure = identifier.pick(
        [candidate(name) for name in names],
        frozenset(),
        options.pop("deadline", time.monotonic() + 5),  # type: ignore[arg-type]
        distinct=True,
        keep=bool(options.pop("keep", False)),
    )
    return picked[0].name, sure


def lists(kubelet: KubeletEmulator) -> int:
    return kubelet.pod_resources_calls.by_method.get("List", 0)


@pytest.mark.usefixtures("plugins")
def test_a_candidate_kubelet_does_not_list_is_passed_over(kubelet: KubeletEmulator) -> None:
    assert kubelet.pod_resources_socket is not None
    holding(kubelet, "b")
    identifier = Identifier(NUMBER, kubelet.pod_resources_socket, Counter())
    assert choose(identifier, ["a", "b"]) == ("b", True)


@pytest.mark.usefixtures("plugins")
def test_a_container_already_holding_the_resource_is_not_the_one(kubelet: KubeletEmulator) -> None:
    assert kubelet.pod_resources_socket is not None
    holding(kubelet, "a", number=1)  # a's container got its vgpu-number devices already
    holding(kubelet, "b")
    identifier = Identifier(NUMBER, kubelet.pod_resources_socket, Counter())
    assert choose(identifier, ["a", "b"]) == ("b", True)


@pytest.mark.usefixtures("plugins")
def test_past_the_first_few_a_container_already_holding_the_resource_is_skipped_too(
    kubelet: KubeletEmulator,
) -> None:
    assert kubelet.pod_resources_socket is not None
    holding(kubelet, "c", number=1)
    holding(kubelet, "d")
    identifier = Identifier(NUMBER, kubelet.pod_resources_socket, Counter())
    later = [candidate("c"), candidate("d")]
    chosen, sure = identifier.pick(
        [candidate("a"), candidate("b")],
        frozenset(),
        time.monotonic() + 5,
        distinct=True,
        keep=False,
        more=lambda: later,
    )
    assert (chosen[0].name, sure) == ("d", True)


@pytest.mark.usefixtures("plugins")
def test_a_container_holding_another_resource_is_the_one_mid_admission(kubelet: KubeletEmulator) -> None:
    """Kubelet allocates a container's resources one after another: listed with vgpu-memory and
    no vgpu-number yet, b is the container it is working on, though a is listed too."""
    assert kubelet.pod_resources_socket is not None
    holding(kubelet, "a")
    holding(kubelet, "b", memory=2)
    identifier = Identifier(NUMBER, kubelet.pod_resources_socket, Counter())
    assert choose(identifier, ["a", "b"]) == ("b", True)


def test_only_kubelets_records_make_a_choice_sure(tmp_path: Path) -> None:
    """A row is confirmed later unless one candidate was left or kubelet's records told: choices by
    the ledger, by arrival or among candidates that would all get the same are not sure."""
    counts: Counter[tuple[str, str]] = Counter()
    identifier = Identifier(MEM, tmp_path / "no-kubelet.sock", counts)
    deadline = time.monotonic() + 5
    only = [candidate("a")]
    assert identifier.pick(only, frozenset(), deadline, distinct=True, keep=False) == (only[0], True)
    both = [candidate("a"), candidate("b")]
    assert identifier.pick(both, frozenset(), deadline, distinct=False, keep=False) == (both[0], False)
    sibling = frozenset({("uid-b", "main")})
    assert identifier.pick(both, sibling, deadline, distinct=True, keep=False) == (both[1], False)
    assert counts == {(MEM, "same-placement"): 1, (MEM, "ledger"): 1}


@pytest.mark.usefixtures("plugins")
def test_the_allocate_after_a_preferred_call_reuses_its_list_for_a_second(kubelet: KubeletEmulator) -> None:
    """GetPreferredAllocation keeps its List answer; the Allocate that follows within
    LISTING_REUSE_S uses it instead of asking kubelet again, once; later calls ask afresh."""
    assert kubelet.pod_resources_socket is not None
    holding(kubelet, "b")
    now = [100.0]
    identifier = Identifier(NUMBER, kubelet.pod_resources_socket, Counter(), clock=lambda: now[0])
    deadline = now[0] + 5
    assert choose(identifier, ["a", "b"], keep=True, deadline=deadline) == ("b", True)
    now[0] += LISTING_REUSE_S
    assert choose(identifier, ["a", "b"], deadline=deadline) == ("b", True)
    assert lists(kubelet) == 1
    assert choose(identifier, ["a", "b"], deadline=deadline) == ("b", True)  # the kept answer is used once
    assert lists(kubelet) == 2
    assert choose(identifier, ["a", "b"], keep=True, deadline=deadline) == ("b", True)
    now[0] += 2 * LISTING_REUSE_S
    assert choose(identifier, ["a", "b"], deadline=deadline) == ("b", True)  # too old: asked again
    assert lists(kubelet) == 4


@pytest.mark.usefixtures("plugins")
def test_kubelet_is_asked_until_the_allocates_deadline(kubelet: KubeletEmulator) -> None:
    """With a second left kubelet's List still decides; at the deadline it is not asked (the
    earliest candidate is taken)."""
    assert kubelet.pod_resources_socket is not None
    holding(kubelet, "b")
    now = [100.0]
    identifier = Identifier(NUMBER, kubelet.pod_resources_socket, Counter(), clock=lambda: now[0])
    assert choose(identifier, ["a", "b"], deadline=now[0] + 1) == ("b", True)
    assert choose(identifier, ["a", "b"], deadline=now[0]) == ("a", False)
    assert lists(kubelet) == 1


def test_list_failures_are_warned_once_until_kubelet_answers_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="deviceplugin.plugin.identify")
    socket = tmp_path / "pr.sock"
    identifier = Identifier(NUMBER, socket, Counter())
    assert choose(identifier, ["a", "b"]) == ("a", False)  # no kubelet yet: arrival decides
    assert choose(identifier, ["a", "b"]) == ("a", False)
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=socket) as kubelet:
        holding(kubelet, "b")
        # The channel reconnects within its back-off (a second at most); until then, arrival.
        eventually(lambda: choose(identifier, ["a", "b"]) == ("b", True))
    assert choose(identifier, ["a", "b"]) == ("a", False)
    failed = "pod-resources List failed; choosing the pod by arrival order"
    records = [r for r in caplog.records if r.name == identify.__name__]
    seen = [(r.levelname, r.getMessage(), r.__dict__["fields"]) for r in records]
    assert {(message, tuple(fields.items())) for _, message, fields in seen} == {
        (failed, (("resource", NUMBER), ("error", "UNAVAILABLE")))
    }
    # One warning while kubelet is away, the rest at debug level; another once it answered again.
    levels = [level for level, _, _ in seen]
    assert levels == ["WARNING", *["DEBUG"] * (len(levels) - 2), "WARNING"]


def test_without_a_pod_resources_socket_kubelet_is_never_asked(caplog: pytest.LogCaptureFixture) -> None:
    identifier = Identifier(NUMBER, None, Counter())
    assert choose(identifier, ["a", "b"]) == ("a", False)
    assert [r for r in caplog.records if r.name == identify.__name__] == []
