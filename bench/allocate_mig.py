"""Allocate latency on a `mig` vGPU node (issue 16's closing figure; docs/mig.md): for a card that
must be repartitioned and for one that need not, against a paced empty RPC in the same run.

The daemon runs as a subprocess (`--gpu-strategy vgpu --vgpu-mode mig`) on `--cards` fake H100
80GB cards in MIG mode, each partitioned beforehand into the built-in `group3` (3g.40gb x2, as
nvidia-mig-parted would leave it) and idle, against the API-server emulator (in this process)
and the kubelet emulator's registration socket. Pods are bound as Volcano's deviceshare plugin
binds them on a MIG node: the fit library under compat="volcano" with the built-in
knownMigGeometries, each pod asking one vGPU of 9000 MiB, which Volcano places in `group1`
(1g.10gb x7). On each card in turn:
- (a) repartitioned: the first pod's slot is `GPU-<uuid>[group1-0]` on the idle card in group3:
  its Allocate destroys the card's instances and creates group1's seven (clear + partition);
- (b) as it is: the second pod's slot is `[group1-1]` on the card now in group1: its Allocate
  only looks the slot's MIG device up.
Each pod is bound, left `--settle-ms` for the daemon's watch to deliver it, then an empty RPC
(GetDevicePluginOptions on the same vgpu-number channel: the floor) and, `--pace-ms` later, the
vgpu-number Allocate, which does the MIG work and is the one timed (the vgpu-memory one that
follows only accounts), and the next pod waits for its `bind-phase: success`. Every answer must be
`NVIDIA_VISIBLE_DEVICES=MIG-...` only, and the daemon must log exactly one repartition per card.
The figures are the median over `--runs` runs (fresh processes each) of each run's p50.

The fake backend creates and destroys MIG instances in memory, in microseconds: (a) measures the
daemon's own work around a repartition (reading the layout, its lock, the ledger check, the
backend calls), not the driver's. NVIDIA's driver destroys and creates GPU and compute instances
far more slowly than the fake's dictionaries; the real figure needs a MIG-capable GPU and the NVML
backend (nothing here measured one).
Run: `.venv/bin/python bench/allocate_mig.py [--cards 8] [--runs 3]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from common import daemon_command, percentiles
from report import Row, record

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import VgpuConfig, keys
from deviceplugin.fit.families.vgpu import VgpuFamily
from deviceplugin.gpu.fake import fake_uuid
from deviceplugin.gpu.mig import builtin_geometries
from deviceplugin.plugin.devices import RESOURCES
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator

NODE = "bench"
MODEL, MIB = "NVIDIA H100 80GB HBM3", 81559
FACTOR = 16  # MiB per vgpu-memory ID: eight H100s' IDs fit kubelet's message at 16
SPLIT = 10  # vgpu-number IDs per card, as the daemon registers by default
POD_MIB = 9000  # one 1g.10gb slot: Volcano places it in group1
BEFORE = ["3g.40gb", "3g.40gb"]  # each card's layout at start: group3, idle
FAMILY = VgpuFamily()
CONFIG = VgpuConfig(memory_factor=FACTOR, mig_geometries=builtin_geometries())
NUMBER, MEMORY, _CORES = (resource.name for resource in RESOURCES["vgpu"])


@dataclass(frozen=True)
class Run:
    """One run's p50s (ms): the vgpu-number Allocate on a card repartitioned and on one used as it
    is, and the paced empty RPC before each."""

    repartitioned: float
    as_is: float
    floor: float


def found(apiserver: ApiServerEmulator, plural: str, name: str, namespace: str = "") -> dict[str, Any]:
    obj = apiserver.get(plural, name, namespace)
    if obj is None:
        raise SystemExit(f"{plural} {name} is gone from the API server")
    return dict(obj)


def node_view(apiserver: ApiServerEmulator, cards: int) -> dict[str, Any]:
    """The node as Volcano's scheduler reads it: the daemon's registration and the allocatable."""
    node = found(apiserver, "nodes", NODE)
    node["status"] = {
        "allocatable": {NUMBER: str(SPLIT * cards), MEMORY: str(cards * MIB // FACTOR), _CORES: "100"}
    }
    return node


def bind(
    apiserver: ApiServerEmulator, name: str, card: int, booked: Sequence[dict[str, Any]], cards: int
) -> dict[str, Any]:
    """Create pod `name` bound by Volcano's rules to card `card` (the others left out of its
    choice), with `booked` pods on it."""
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": NODE,
            "uid": f"uid-{name}",
            "annotations": {keys.VGPU_MODE: "mig"},
        },
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "cuda",
                    "resources": {"limits": {NUMBER: "1", MEMORY: str(POD_MIB // FACTOR)}},
                }
            ]
        },
    }
    gpus = FAMILY.node_gpus(node_view(apiserver, cards), CONFIG, "volcano")
    for other in booked:
        FAMILY.book(gpus, other, "volcano", CONFIG)
    result = FAMILY.fit(
        [gpus[card]], pod, FAMILY.request(pod, "volcano"), policy="binpack", compat="volcano", config=CONFIG
    )
    if not result.ok:
        raise SystemExit(f"Volcano's fit refused {name} on card {card}: {result.reason}")
    pod["metadata"]["annotations"].update(FAMILY.bind_annotations(result, NODE, time.time_ns(), "volcano"))
    del pod["metadata"]["uid"]
    pod["spec"]["nodeName"] = NODE
    return dict(apiserver.create("pods", pod))


def wait(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.01)


def requests(card: int, second: bool) -> tuple[pb.AllocateRequest, pb.AllocateRequest]:
    """Kubelet's vgpu-number and vgpu-memory Allocates for a pod on the card (its next free IDs)."""
    uuid, units = fake_uuid(card), POD_MIB // FACTOR
    first_id = units if second else 0
    number = [f"{uuid}-{int(second)}"]
    memory = [f"{uuid}-memory-{k}" for k in range(first_id, first_id + units)]
    number_request, memory_request = (
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        for ids in (number, memory)
    )
    return number_request, memory_request


Stubs = tuple[deviceplugin_grpc.DevicePluginStub, deviceplugin_grpc.DevicePluginStub]  # number, memory


def serve(
    apiserver: ApiServerEmulator,
    plugins: Stubs,
    args: argparse.Namespace,
    card: int,
    booked: list[dict[str, Any]],
) -> tuple[float, float]:
    """Bind the card's next pod and serve it as kubelet would: (empty RPC, vgpu-number Allocate) in
    ms. Its answer must be one MIG device and nothing else."""
    second = bool(booked)
    name = f"c{card}-{'as-is' if second else 'repartitioned'}"
    pod = bind(apiserver, name, card, booked, args.cards)
    slot, wanted = pod["metadata"]["annotations"][keys.DEVICES_TO_ALLOCATE], f"[group1-{int(second)}]"
    if wanted not in slot:
        raise SystemExit(f"Volcano's fit gave {name} {slot}, not {wanted}")
    booked.append(pod)
    time.sleep(args.settle_ms / 1000)  # the daemon's watch delivers the pod
    number, memory = plugins
    began = time.perf_counter()
    number.GetDevicePluginOptions(pb.Empty(), timeout=10)
    empty = (time.perf_counter() - began) * 1000
    time.sleep(args.pace_ms / 1000)
    asked, accounted = requests(card, second)
    began = time.perf_counter()
    answer = number.Allocate(asked, timeout=30)
    allocate = (time.perf_counter() - began) * 1000
    memory.Allocate(accounted, timeout=30)
    (container,) = answer.container_responses
    envs = dict(container.envs)
    if set(envs) != {"NVIDIA_VISIBLE_DEVICES"} or not envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-"):
        raise SystemExit(f"{name} got {envs}, not one MIG device")

    def served() -> bool:
        notes = found(apiserver, "pods", name, NODE)["metadata"].get("annotations", {})
        return bool(notes.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS)

    wait(served, f"{name} bind-phase success")
    return empty, allocate


def spec_file(work: Path, cards: int) -> Path:
    """The fake cards: H100 80GB in MIG mode, each partitioned in group3 beforehand."""
    spec = work / "gpus.json"
    entry = {"model": MODEL, "memory_mib": MIB, "mig_enabled": True, "mig_instances": BEFORE}
    spec.write_text(json.dumps([{"uuid": fake_uuid(i), **entry} for i in range(cards)]))
    return spec


def one_run(args: argparse.Namespace, number: int) -> Run:
    work = Path(tempfile.mkdtemp(prefix="dpmig", dir="/tmp"))
    hook = work / "hook"
    hook.mkdir()
    took: dict[str, list[float]] = {"repartitioned": [], "as_is": [], "floor": []}
    log = work / "daemon.log"
    sockets = [work / "dp" / resource.socket for resource in RESOURCES["vgpu"][:2]]
    with ApiServerEmulator() as apiserver, KubeletEmulator(work / "dp"), log.open("w") as out:
        apiserver.create("nodes", {"metadata": {"name": NODE}})
        apiserver.create("namespaces", {"metadata": {"name": NODE}})
        extra = [
            "--kubeconfig", str(apiserver.write_kubeconfig(work / "kc")),
            "--pod-resources-socket", str(work / "none.sock"),
            "--gpu-strategy", "vgpu", "--vgpu-mode", "mig", "--hook-path", str(hook),
            "--gpu-memory-factor", str(FACTOR), "--log-level", "info",
        ]  # fmt: skip
        command = daemon_command(work, NODE, str(spec_file(work, args.cards)), extra)
        daemon = subprocess.Popen(command, stdout=out, stderr=out)
        try:
            wait(lambda: all(socket.exists() for socket in sockets), "the vgpu sockets")
            wait(
                lambda: (
                    keys.NODE_VGPU_REGISTER
                    in found(apiserver, "nodes", NODE)["metadata"].get("annotations", {})
                ),
                "the node's registration",
            )
            with contextlib.ExitStack() as stack:
                number_plugin, memory_plugin = (
                    deviceplugin_grpc.DevicePluginStub(
                        stack.enter_context(grpc.insecure_channel(f"unix://{s}"))
                    )
                    for s in sockets
                )
                number_plugin.GetDevicePluginOptions(pb.Empty(), timeout=30)
                time.sleep(1)  # the daemon's start-up work done
                for card in range(args.cards):
                    booked: list[dict[str, Any]] = []
                    for kind in ("repartitioned", "as_is"):
                        empty, allocate = serve(apiserver, (number_plugin, memory_plugin), args, card, booked)
                        took["floor"].append(empty)
                        took[kind].append(allocate)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    lines = log.read_text().splitlines()
    repartitions = sum("mig card partitioned" in line and "group1" in line for line in lines)
    if repartitions != args.cards:
        raise SystemExit(
            f"the daemon logged {repartitions} repartitions into group1, not {args.cards} (one a card)"
        )
    shutil.rmtree(work, ignore_errors=True)
    run = Run(*(percentiles(took[kind])[0] for kind in ("repartitioned", "as_is", "floor")))
    print(
        f"run {number + 1}: Allocate p50 repartitioned {run.repartitioned:.3f} ms, "
        f"as it is {run.as_is:.3f} ms; paced empty RPC p50 {run.floor:.3f} ms ({args.cards} cards)",
        flush=True,
    )
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cards", type=int, default=8, help="fake H100 80GB cards: one sample of each case per card"
    )
    parser.add_argument("--runs", type=int, default=3, help="the figures are the median of the runs")
    parser.add_argument(
        "--settle-ms", type=float, default=200.0, help="after a pod is bound, before its RPCs"
    )
    parser.add_argument("--pace-ms", type=float, default=2.0, help="between the empty RPC and the Allocate")
    args = parser.parse_args()
    runs = [one_run(args, n) for n in range(args.runs)]

    def median(kind: str) -> float:
        return float(statistics.median(getattr(run, kind) for run in runs))

    floor = median("floor")
    repartitioned, as_is = median("repartitioned"), median("as_is")
    print(
        f"\nmig node, {args.cards} H100 80GB cards (fake backend): "
        f"median of {len(runs)} run(s) of each run's p50"
    )
    record(
        [
            Row(
                "MIG Allocate p50, card repartitioned group3 -> group1 (fake backend: not the driver's cost)",
                repartitioned,
                "ms",
                floor,
                "reported (the driver's create/destroy needs a GPU)",
                True,
            ),
            Row(
                "MIG Allocate p50, card already in the pod's group",
                as_is,
                "ms",
                floor,
                "ratio <= 2 (floor: paced empty RPC p50)",
                as_is <= 2 * floor,
            ),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
