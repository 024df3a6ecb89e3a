"""A whole cluster on one machine, over real transports: the API-server emulator, simulated GPU
nodes (each a kubelet emulator and the real daemon, `deviceplugin run` with fake GPUs, in its own
directory), one scheduler extender per GPU strategy, and a small scheduling loop that drives a
pending pod through extender filter -> prioritize -> bind over HTTP, then has the node's kubelet
admit it (GetPreferredAllocation and Allocate over gRPC) and report its phase.
"""

from __future__ import annotations

import json
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
from deviceplugin.fit import keys, objects
from deviceplugin.fit.keys import Strategy
from deviceplugin.kube.api import Kube, load_client
from deviceplugin.plugin.devices import RESOURCES
from deviceplugin.sim import podstatus
from deviceplugin.sim.admission import Admission
from deviceplugin.sim.apiserver import ApiServerEmulator
from deviceplugin.sim.apiserver.meta import rfc3339
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.nodestatus import NodeStatusReporter

STARTUP_S = 30.0
HTTP_TIMEOUT_S = 10.0
_METRICS_PORT = re.compile(r"metrics listening.*port=(\d+)")
# The resource that tells which GPU family (and so which extender) a pod belongs to.
STRATEGY_OF = {
    keys.GPU_MEMORY: "share",
    keys.GPU_NUMBER: "number",
    keys.VGPU_NUMBER: "vgpu",
    keys.VGPU_MEMORY: "vgpu",
    keys.VGPU_CORES: "vgpu",
}


class SimulationError(Exception):
    """A part of the simulated cluster did not start or did not behave."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    strategy: Strategy
    fake_gpus: str  # COUNTxMIB


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


def pod_strategy(pod: Mapping[str, Any]) -> str | None:
    for container in [*objects.init_containers(pod), *objects.containers(pod)]:
        for resource in objects.limits(container):
            if resource in STRATEGY_OF:
                return STRATEGY_OF[resource]
    return None


def _post(url: str, body: object) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        return json.loads(response.read())


class SimCluster:
    def __init__(self, directory: Path, nodes: Sequence[NodeSpec], policy: str = "binpack") -> None:
        self.directory = directory
        self.node_specs = tuple(nodes)
        self.policy = policy
        self.apiserver = ApiServerEmulator()
        self.kubeconfig = directory / "kubeconfig"
        self.nodes: dict[str, SimNode] = {}
        self.extenders: dict[str, Extender] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self.apiserver.start()
        self.apiserver.write_kubeconfig(self.kubeconfig)
        kube = Kube(load_client(self.kubeconfig))
        for index, spec in enumerate(self.node_specs):
            self.apiserver.create(
                "nodes", {"metadata": {"name": spec.name, "labels": {"nvidia.com/gpu.present": "true"}}}
            )
            self.nodes[spec.name] = self._start_node(spec, kube, index)
        for strategy in sorted({spec.strategy for spec in self.node_specs}):
            config = ExtenderConfig(strategy=strategy, policy=self.policy)  # type: ignore[arg-type]
            self.extenders[strategy] = Extender(config, kube, address="127.0.0.1:0").start()
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
        command = [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "run",
            *("--node-name", spec.name),
            *("--gpu-strategy", spec.strategy),
            *("--fake-gpus", spec.fake_gpus),
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
        return SimNode(spec, directory, kubelet, status, daemon, log, pod_ips)

    def _wait_ready(self, node: SimNode) -> None:
        """Until kubelet streams every resource, the daemon is ready and the node's allocatable
        (which the node status reporter writes) shows what kubelet holds."""
        resources = [resource.name for resource in RESOURCES[node.spec.strategy]]
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if node.daemon.poll() is not None:
                raise SimulationError(f"node {node.spec.name}: the daemon exited\n{node.output()}")
            states = [node.kubelet.resource(name) for name in resources]
            if all(s is not None and s.messages > 0 for s in states) and self._ready(node):
                counts = {s.name: str(s.allocatable) for s in states if s is not None}
                shown = (self.apiserver.get("nodes", node.spec.name) or {}).get("status") or {}
                if counts.items() <= (shown.get("allocatable") or {}).items():
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
        """One scheduling cycle through the extender, then admission by the node's kubelet."""
        meta = objects.metadata(pod)
        placement = Placement(str(meta.get("namespace")), str(meta.get("name")))
        strategy = pod_strategy(pod)
        extender = self.extenders.get(strategy or "")
        if extender is None:
            placement.problem = f"asks for no GPU resource this cluster schedules ({strategy or 'none'})"
            return placement
        args = {"Pod": pod, "NodeNames": sorted(self.nodes)}
        filtered = _post(extender.url + "/filter", args)
        names = filtered.get("NodeNames") or []
        if filtered.get("Error") or not names:
            reasons = "; ".join(f"{n}: {why}" for n, why in (filtered.get("FailedNodes") or {}).items())
            placement.problem = f"unschedulable: {filtered.get('Error') or reasons or 'no node fits'}"
            return placement
        scores = _post(extender.url + "/prioritize", {**args, "NodeNames": names})
        best = max(names, key=lambda n: (next((s["Score"] for s in scores if s["Host"] == n), 0), n))
        bound = _post(
            extender.url + "/bind",
            {
                "PodName": placement.name,
                "PodNamespace": placement.namespace,
                "PodUID": objects.uid(pod),
                "Node": best,
            },
        )
        if bound.get("Error"):
            placement.problem = f"bind to {best} failed: {bound['Error']}"
            return placement
        placement.node = best
        return self._admit(placement)

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
        else:
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


def _marked(notes: Mapping[str, str]) -> bool:
    """The device plugin has recorded the pod as served."""
    return notes.get(keys.GPU_ASSIGNED) == "true" or notes.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS
