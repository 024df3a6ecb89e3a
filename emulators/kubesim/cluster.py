"""A whole cluster on one machine, over real transports: the API-server emulator, simulated GPU
nodes (each a kubelet emulator and the real daemon, `deviceplugin run` with fake GPUs of the node's
own, in its own directory), one scheduler extender per GPU strategy, and the simulated scheduler
(`scheduler`: kube-scheduler's filters, extender filter -> prioritize -> bind over HTTP, gangs all
or nothing, events); the node's kubelet then admits each bound pod (GetPreferredAllocation and
Allocate over gRPC) and reports its phase.
"""

from __future__ import annotations

import contextlib
import platform
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deviceplugin.extender import Extender, ExtenderConfig
from deviceplugin.extender.config import Policy
from deviceplugin.fit import keys, objects
from deviceplugin.fit.fragment import Weights
from deviceplugin.gpu.mps import MpsControl, MpsError, MpsRoot
from deviceplugin.kube.api import Kube, load_client
from deviceplugin.plugin.devices import RESOURCES
from kubesim import podstatus
from kubesim.admission import Admission
from kubesim.apiserver import ApiServerEmulator
from kubesim.apiserver.meta import rfc3339
from kubesim.ascend import AscendNodeSpec
from kubesim.failures import SimulationError
from kubesim.kubelet import KubeletEmulator
from kubesim.nodes import MPS_CONTROL, NodeSpec
from kubesim.nodestatus import NodeStatusReporter
from kubesim.scenario import GPU_AWARE_OFF
from kubesim.scheduler import Decision, SimScheduler
from kubesim.workloads import Gang

STARTUP_S = 30.0
ASCEND = "ascend"  # the key of the extender serving the Ascend chips
HTTP_TIMEOUT_S = 10.0
_METRICS_PORT = re.compile(r"metrics listening.*port=(\d+)")


@dataclass
class SimNode:
    """A GPU node: kubelet emulator (with its node status) plus the real daemon, in `directory`."""

    spec: NodeSpec
    directory: Path
    kubelet: KubeletEmulator
    status: NodeStatusReporter
    daemon: subprocess.Popen[bytes]
    log: Path
    #: The node's pod network, one address per started pod (10.244.<node>.0/24, as a CNI would).
    pod_ips: Iterator[str]
    #: An `mps` node's control daemons (the daemon starts them and leaves them running when it stops).
    mps: MpsControl | None = None

    @property
    def ledger(self) -> Path:
        return self.directory / "state" / "ledger.db"

    def metrics_url(self) -> str:
        found = _METRICS_PORT.findall(self.log.read_text())
        if not found:
            raise SimulationError(f"node {self.spec.name}: the daemon has not opened its metrics port")
        return f"http://127.0.0.1:{found[-1]}"

    def output(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text().splitlines()[-lines:])


@dataclass
class Placement:
    """What happened to one pod: where the scheduler put it and what its containers got."""

    namespace: str
    name: str
    node: str = ""
    problem: str = ""
    admission: Admission | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    #: The pod as submitted (with the UID the API server gave it), and the phase it ended in.
    pod: dict[str, Any] = field(default_factory=dict)
    phase: str = "Pending"
    gang: str = ""  # namespace/name of its pod group when scheduled as one


class SimCluster:
    def __init__(
        self,
        directory: Path,
        nodes: Sequence[NodeSpec],
        policy: Policy = "binpack",
        weight: int = 1,
        ascend_nodes: Sequence[AscendNodeSpec] = (),
        *,
        gpu_aware: Weights = GPU_AWARE_OFF,
    ) -> None:
        self.directory = directory
        self.node_specs = tuple(nodes)
        #: Nodes of HAMi's Ascend device plugin: only what it publishes, no daemon, no admission.
        self.ascend_specs = {spec.name: spec for spec in ascend_nodes}
        self.policy: Policy = policy
        self.weight = weight
        #: The GPU extenders' gpu-aware score weights (docs/gpu-aware.md).
        self.gpu_aware = gpu_aware
        self.apiserver = ApiServerEmulator()
        self.kubeconfig = directory / "kubeconfig"
        self.nodes: dict[str, SimNode] = {}
        self.extenders: dict[str, Extender] = {}
        self.scheduler = SimScheduler(self.apiserver, self.extenders)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self.apiserver.start()
        self.apiserver.write_kubeconfig(self.kubeconfig)
        kube = Kube(load_client(self.kubeconfig))
        for index, spec in enumerate(self.node_specs):
            labels = _labels(spec.name) | spec.labels
            self.apiserver.create("nodes", {"metadata": {"name": spec.name, "labels": labels}})
            self.nodes[spec.name] = self._start_node(spec, kube, index)
        for npu in self.ascend_specs.values():
            self.apiserver.create("nodes", npu.node(_labels(npu.name, gpu=False)))
            self.apiserver.patch("nodes", npu.name, {"status": npu.status()}, subresource="status")
        # The GPU extenders leave Ascend alone; one extender of its own serves it (as a cluster
        # would list the Ascend resources under one extender's managedResources).
        for strategy in sorted({spec.strategy for spec in self.node_specs}):
            config = ExtenderConfig(
                strategy=strategy,
                policy=self.policy,
                weight=self.weight,
                ascend_hami_vnpu=False,
                gpu_aware_weight=self.gpu_aware.weight,
                gpu_aware_loss_weight=self.gpu_aware.loss_weight,
            )
            self.extenders[strategy] = Extender(config, kube, address="127.0.0.1:0").start()
        if self.ascend_specs:
            config = ExtenderConfig(policy=self.policy, weight=self.weight, ascend_hami_vnpu=True)
            self.extenders[ASCEND] = Extender(config, kube, address="127.0.0.1:0").start()
        for node in self.nodes.values():
            self._wait_ready(node)

    def _start_node(self, spec: NodeSpec, kube: Kube, index: int) -> SimNode:
        directory = self.directory / spec.name
        hook = directory / "hook"
        hook.mkdir(parents=True)
        (hook / "libvgpu.so").write_bytes(b"stand-in for HAMi-core's library\n")
        pod_resources = directory / "pod-resources.sock"
        status = NodeStatusReporter(spec.name, kube)
        kubelet = KubeletEmulator(
            directory / "plugins", pod_resources_socket=pod_resources, listener=status.kubelet_event
        )
        kubelet.start()
        status.start()
        log = directory / "daemon.log"
        # Not below the node's directory: the control sockets (<root>/<uuid>/pipe/control) are long.
        mps_root = self.directory / f"mps{index}"
        command = [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "run",
            *("--node-name", spec.name),
            *("--gpu-strategy", spec.strategy),
            *("--fake-gpus", str(spec.write_fake_gpus(directory / "gpus.json"))),
            *("--gpu-memory-factor", str(spec.memory_factor)),
            *spec.daemon_options(mps_root),
            *("--device-plugin-dir", str(directory / "plugins")),
            *("--pod-resources-socket", str(pod_resources)),
            *("--state-dir", str(directory / "state")),
            *("--hook-path", str(hook)),
            *("--kubeconfig", str(self.kubeconfig)),
            *("--metrics-address", "127.0.0.1:0"),
        ]
        with log.open("wb") as out:
            daemon = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        pod_ips = (f"10.244.{index}.{host}" for host in range(2, 255))
        mps = MpsControl(MPS_CONTROL, MpsRoot(mps_root)) if spec.mode == keys.MODE_MPS else None
        return SimNode(spec, directory, kubelet, status, daemon, log, pod_ips, mps)

    def _wait_ready(self, node: SimNode) -> None:
        """Until kubelet streams every resource, the daemon is ready, the node's allocatable
        (which the node status reporter writes) shows what kubelet holds, and the strategy's
        extender sees the GPUs the daemon publishes (a daemon registers with kubelet before it
        writes to the API server: scheduling earlier would find the node without GPUs)."""
        resources = [resource.name for resource in RESOURCES[node.spec.strategy]]
        extender = self.extenders[node.spec.strategy]
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if node.daemon.poll() is not None:
                raise SimulationError(f"node {node.spec.name}: the daemon exited\n{node.output()}")
            states = [node.kubelet.resource(name) for name in resources]
            if all(s is not None and s.messages > 0 for s in states) and self._ready(node):
                counts = {s.name: str(s.allocatable) for s in states if s is not None}
                shown = (self.apiserver.get("nodes", node.spec.name) or {}).get("status") or {}
                view = extender.inventory.view(node.spec.name)
                published = view is not None and view.known and bool(view.gpus)
                if counts.items() <= (shown.get("allocatable") or {}).items() and published:
                    return
            time.sleep(0.05)
        raise SimulationError(f"node {node.spec.name}: not ready within {STARTUP_S:g} s\n{node.output()}")

    def _ready(self, node: SimNode) -> bool:
        try:
            with urllib.request.urlopen(node.metrics_url() + "/readyz", timeout=HTTP_TIMEOUT_S) as answer:
                return bool(answer.status == 200)
        except (SimulationError, OSError):
            return False

    def stop(self) -> None:
        for extender in self.extenders.values():
            extender.stop()
        for node in self.nodes.values():
            node.daemon.terminate()
        for node in self.nodes.values():
            try:
                node.daemon.wait(10)
            except subprocess.TimeoutExpired:
                node.daemon.kill()
            _stop_mps(node)
            node.kubelet.stop()
            node.status.stop()
        self.apiserver.stop()

    # --- scheduling -----------------------------------------------------------------------------

    def submit(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        namespace = str(objects.metadata(pod).get("namespace") or "default")
        if self.apiserver.get("namespaces", namespace) is None:
            self.apiserver.create("namespaces", {"metadata": {"name": namespace}})
        return self.apiserver.create(
            "pods", {**pod, "metadata": {**objects.metadata(pod), "namespace": namespace}}
        )

    def schedule(self, pod: Mapping[str, Any]) -> Placement:
        """One scheduling cycle, then admission by the node's kubelet."""
        return self._placed(self.scheduler.schedule(dict(pod)))

    def play(self, pods: Sequence[Mapping[str, Any]], gangs: Sequence[Gang] = ()) -> list[Placement]:
        """Submit every pod, then schedule them in order (a gang where its first member stands, all
        of it at once) and have each bound one admitted; the placements in the pods' order."""
        submitted = [self.submit(pod) for pod in pods]
        by_key = {objects.namespaced_name(pod): pod for pod in submitted}
        gang_of = {f"{g.namespace}/{name}": g for g in gangs for name in g.pods}
        placements: dict[str, Placement] = {}
        for pod in submitted:
            key = objects.namespaced_name(pod)
            if key in placements:
                continue
            gang = gang_of.get(key)
            if gang is None:
                placements[key] = self._placed(self.scheduler.schedule(pod))
                continue
            members = [by_key[f"{gang.namespace}/{name}"] for name in gang.pods]
            self.apiserver.create("podgroups", gang.podgroup(running=0))
            running = 0
            for decision in self.scheduler.schedule_gang(members, gang):
                placement = self._placed(decision)
                placement.gang = f"{gang.namespace}/{gang.name}"
                placements[decision.key] = placement
                running += placement.phase == "Running"
            status = {"status": gang.podgroup(running)["status"]}
            self.apiserver.patch("podgroups", gang.name, status, gang.namespace, subresource="status")
        return [placements[objects.namespaced_name(pod)] for pod in submitted]

    def _placed(self, decision: Decision) -> Placement:
        meta = objects.metadata(decision.pod)
        placement = Placement(str(meta.get("namespace")), str(meta.get("name")), pod=decision.pod)
        placement.problem = decision.problem
        if decision.node:
            placement.node = decision.node
            if decision.node not in self.ascend_specs:  # HAMi's Ascend plugin is not emulated
                self._admit(placement)
        return placement

    def _admit(self, placement: Placement) -> Placement:
        pod = self.apiserver.get("pods", placement.name, placement.namespace)
        if pod is None:
            placement.problem = "the pod vanished after its bind"
            return placement
        node = self.nodes[placement.node]
        admission = node.kubelet.admit(pod)
        placement.admission = admission
        if admission.admitted:
            status = podstatus.started(
                pod, host_ip=node.status.machine.address, pod_ip=next(node.pod_ips), at=rfc3339(time.time())
            )
            placement.phase = "Running"
        else:
            placement.phase = "Failed"
            placement.problem = f"{admission.reason}: {admission.message}"
            status = podstatus.rejected(admission.reason, admission.message)
        self.apiserver.patch(
            "pods", placement.name, {"status": status}, placement.namespace, subresource="status"
        )
        return placement

    def settle(self, placements: Sequence[Placement], timeout_s: float = 5.0) -> None:
        """Wait until the daemons' outboxes have marked every admitted pod, then read its annotations."""
        deadline = time.monotonic() + timeout_s
        for placement in placements:
            while True:
                pod = self.apiserver.get("pods", placement.name, placement.namespace) or {}
                placement.annotations = dict(objects.annotations_of(pod)) if pod else {}
                if (
                    not placement.admission
                    or not placement.admission.admitted
                    or _marked(placement.annotations)
                ):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


def _stop_mps(node: SimNode) -> None:
    """Quit the control daemons the node's daemon left running (a GPU whose daemon never came up
    does not answer: nothing to quit)."""
    if node.mps is None:
        return
    for gpu in node.spec.gpus:
        with contextlib.suppress(MpsError):
            node.mps.ask(gpu.uuid, "quit")


def _labels(name: str, gpu: bool = True) -> dict[str, str]:
    """What kubelet labels its node with, and the GPU feature discovery's presence label."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch}
    return labels | ({"nvidia.com/gpu.present": "true"} if gpu else {})


def _marked(notes: Mapping[str, str]) -> bool:
    """The device plugin has recorded the pod as served."""
    return notes.get(keys.GPU_ASSIGNED) == "true" or notes.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS
