"""Dynamic MIG end to end (issue 16 items 1-2, docs/mig.md): the daemon as a subprocess in
`--vgpu-mode mig` on a fake H100 80GB in MIG mode, pods bound with the annotations Volcano's
deviceshare plugin writes for a MIG node (the fit library under compat="volcano", geometries from
the built-in knownMigGeometries), admitted by the kubelet emulator over real sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deviceplugin.fit import VgpuConfig
from deviceplugin.fit.families.vgpu import VgpuFamily
from deviceplugin.fit.model import GpuState
from deviceplugin.gpu.mig import builtin_geometries
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, NODE, Daemon, eventually
from tests.e2e.test_vgpu import MEMORY, NUMBER, REGISTER, launch, notes

FAMILY = VgpuFamily()
FACTOR = 4  # MiB per vgpu-memory unit: at 1 the H100's device list is over kubelet's message limit
CONFIG = VgpuConfig(memory_factor=FACTOR, mig_geometries=builtin_geometries())
H100 = {"uuid": GPU0, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "mig_enabled": True}


def mig_daemon(
    start: Callable[..., Daemon], apiserver: ApiServerEmulator, kubelet: KubeletEmulator, workdir: Path
) -> Daemon:
    spec = workdir / "gpus.json"
    spec.write_text(json.dumps([H100]))
    events = workdir / "gpu-events.jsonl"
    events.touch()
    daemon = launch(
        start,
        apiserver,
        kubelet,
        workdir,
        "--fake-gpus",
        str(spec),
        "--fake-gpu-events",
        str(events),
        "--gpu-memory-factor",
        str(FACTOR),
        "--vgpu-mode",
        "mig",
    )
    eventually(lambda: REGISTER in notes(apiserver, "nodes", NODE), daemon)
    return daemon


def cards(apiserver: ApiServerEmulator, booked: list[dict[str, Any]]) -> list[GpuState]:
    """The node's cards as Volcano's scheduler reads them, with `booked` pods on them."""
    node = {
        "metadata": {"name": NODE, "annotations": notes(apiserver, "nodes", NODE)},
        "status": {
            "allocatable": {NUMBER: "7", MEMORY: str(81559 // FACTOR), "volcano.sh/vgpu-cores": "100"}
        },
    }
    gpus = FAMILY.node_gpus(node, CONFIG, "volcano")
    for pod in booked:
        FAMILY.book(gpus, pod, "volcano", CONFIG)
    return gpus


def bound(
    apiserver: ApiServerEmulator, name: str, memory: int, booked: list[dict[str, Any]], when: int
) -> dict[str, Any]:
    """A pod asking one vGPU of `memory` MiB, bound by Volcano's rules on the node as `booked` holds it."""
    units = memory // FACTOR
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "annotations": {"volcano.sh/vgpu-mode": "mig"},
        },
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "image": "cuda",
                    "resources": {"limits": {NUMBER: "1", MEMORY: str(units)}},
                }
            ]
        },
    }
    gpus = cards(apiserver, booked)
    assert gpus[0].mode == "mig"
    result = FAMILY.fit(
        gpus, pod, FAMILY.request(pod, "volcano"), policy="binpack", compat="volcano", config=CONFIG
    )
    assert result.ok, result.reason
    pod["metadata"]["annotations"].update(
        FAMILY.bind_annotations(result, NODE, when * 1_000_000_000, "volcano")
    )
    del pod["metadata"]["uid"]
    pod["spec"]["nodeName"] = NODE
    return apiserver.create("pods", pod)


def phase(apiserver: ApiServerEmulator, name: str) -> str | None:
    return notes(apiserver, "pods", name).get("volcano.sh/bind-phase")


def test_mig_pods_partition_share_and_repartition_the_card(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = mig_daemon(start, apiserver, kubelet, workdir)
    assert (
        notes(apiserver, "nodes", NODE)[REGISTER]
        == f"{GPU0},10,{81559 // FACTOR},NVIDIA-NVIDIA H100 80GB HBM3,true,mig:"
    )

    first = bound(apiserver, "first", 9000, [], 1)
    assert (
        first["metadata"]["annotations"]["volcano.sh/devices-to-allocate"]
        == f"{GPU0}[group1-0],NVIDIA,{9000 // FACTOR},0:"
    )
    admission = kubelet.admit(first)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    envs = admission.allocation("worker", NUMBER).envs
    assert set(envs) == {"NVIDIA_VISIBLE_DEVICES"} and envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert admission.allocation("worker", NUMBER).mounts == []  # nothing of HAMi-core
    eventually(lambda: phase(apiserver, "first") == "success", daemon)

    second = bound(apiserver, "second", 9000, [first], 2)  # the same group, the next slot
    assert second["metadata"]["annotations"]["volcano.sh/devices-to-allocate"].startswith(f"{GPU0}[group1-1]")
    admission = kubelet.admit(second)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    other = admission.allocation("worker", NUMBER).envs["NVIDIA_VISIBLE_DEVICES"]
    assert other.startswith("MIG-") and other != envs["NVIDIA_VISIBLE_DEVICES"]
    assert daemon.output().count("mig card partitioned") == 1  # reused, not made again

    # A scheduler that missed both pods puts a big one in another group: refused, the card kept.
    stale = bound(apiserver, "stale", 30000, [], 3)
    assert "[group3-0]" in stale["metadata"]["annotations"]["volcano.sh/devices-to-allocate"]
    refusal = kubelet.admit(stale)
    assert not refusal.admitted
    assert (
        "holds pods in MIG group group1; it takes MIG group group3 only once they are gone" in refusal.message
    )
    eventually(lambda: phase(apiserver, "stale") == "failed", daemon)
    events = [e for e in apiserver.list("events", "ml") if e["involvedObject"]["name"] == "stale"]
    assert any(e["reason"] == "GpuAllocationFailed" for e in events)

    # Once its pods are gone the card takes the whole-card group.
    for pod in (first, second):
        kubelet.release(pod["metadata"]["uid"])
    for name in ("first", "second", "stale"):
        apiserver.delete("pods", name, "ml")
    eventually(lambda: daemon.output().count("ledger released") >= 2, daemon)
    whole = bound(apiserver, "whole", 70000, [], 4)
    admission = kubelet.admit(whole)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    assert admission.allocation("worker", NUMBER).envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert daemon.output().count("mig card partitioned") == 2


def test_bad_slots_and_a_failed_create_are_refused_and_leave_the_card_usable(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = mig_daemon(start, apiserver, kubelet, workdir)
    bound(apiserver, "astray", 9000, [], 1)
    # Past the group's slots: Volcano's scheduler writes what its geometry allows, a hand edit does not.
    slot = f"{GPU0}[group3-5],NVIDIA,{9000 // FACTOR},0:"
    written = {"volcano.sh/devices-to-allocate": slot, "volcano.sh/vgpu-ids-new": slot}
    astray = apiserver.patch("pods", "astray", {"metadata": {"annotations": written}}, "ml")
    refusal = kubelet.admit(astray)
    assert not refusal.admitted
    assert "group group3 has 2 slot(s), 0 to 1" in refusal.message
    eventually(lambda: phase(apiserver, "astray") == "failed", daemon)

    with (workdir / "gpu-events.jsonl").open("a") as events:
        events.write(json.dumps({"mig_fail": GPU0, "error": "Unknown Error", "after": 3}) + "\n")
    unlucky = bound(apiserver, "unlucky", 9000, [], 2)
    refusal = kubelet.admit(unlucky)
    assert not refusal.admitted
    assert (
        "cannot be partitioned into MIG group group1" in refusal.message
        and "Unknown Error" in refusal.message
    )
    eventually(lambda: phase(apiserver, "unlucky") == "failed", daemon)

    lucky = bound(apiserver, "lucky", 9000, [], 3)  # the failure was once: nothing half-made is in the way
    admission = kubelet.admit(lucky)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    eventually(lambda: phase(apiserver, "lucky") == "success", daemon)
