"""Telling apart pods that ask the same count, against the kubelet emulator's pod-resources socket."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.plugin.identify import Identifier
from deviceplugin.plugin.pending import ContainerNeed, PendingPod
from deviceplugin.sim.kubelet import KubeletEmulator

MEM = "volcano.sh/gpu-memory"
NUMBER = "volcano.sh/vgpu-number"


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
    sibling = frozenset({("uid-b", "main", NUMBER)})  # b's container was served for another resource
    assert identifier.pick(first, sibling, deadline, distinct=True, keep=False)[0][0].name == "b"
    chosen, sure = identifier.pick(first, frozenset(), deadline, distinct=True, keep=False)
    assert (chosen[0].name, sure) == ("a", False)
    assert counts == {(MEM, "ledger"): 1, (MEM, "arrival"): 1}
