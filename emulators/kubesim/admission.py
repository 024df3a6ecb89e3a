"""Kubelet's device admission, emulated: which devices each container gets, and kubelet's checkpoint.

Follows kubelet's device manager (reference/device-plugin-landscape.md §1.3) with no topology-manager
hint, kubelet's default:

- One pod at a time; containers in kubelet's order: init containers (sidecars among them) in spec
  order, then app containers. Each extended resource in a container's ``limits`` that a plugin
  registered is allocated on its own; other resources are left to other admit handlers. Kubelet
  ranges over ``limits``, a Go map, so the order of a container's resources is unspecified: the
  emulator shuffles it (seeded, so a run repeats), and ``admit(pod, resource_order=...)`` fixes it.
- A batch of pods (kubelet's ``HandlePodAdditions``: the first list after a restart) is admitted in
  creation-time order (`admit_batch`); ties keep the order given.
- Kubelet records each resource's devices as soon as its Allocate returns, and the pod under
  admission is already in its pod manager: pod-resources ``List`` shows that pod, with the devices
  of the resources allocated so far, while the next Allocate runs (`listed`). A refused pod is
  terminal and leaves the list.
- Devices that a run-to-completion init container got are *reusable*: later containers of the same pod
  take them first. A sidecar (init container with ``restartPolicy: Always``) and app containers keep
  theirs, so those leave the reusable pool.
- Candidates are the healthy devices nobody holds. Kubelet asks ``GetPreferredAllocation`` whenever the
  plugin advertised it and devices remain to be picked after the reusable ones (without a NUMA hint
  there is no "aligned" set, so it asks even when every candidate is needed). It takes the answer's IDs
  that are candidates and fills any shortfall with its own pick; a failed call rejects the pod.
- ``Allocate`` carries exactly one ``ContainerAllocateRequest``; an error or an empty response rejects
  the pod. Every refusal reaches the pod as ``UnexpectedAdmissionError`` with
  ``Allocate failed due to <why>, which is unexpected``.
- The checkpoint keeps each (pod, container, resource)'s device IDs and whole response; admitting a pod
  it already holds replays them without calling the plugin, after checking they are still healthy.

Plugin calls are made with no deadline and no lock held but the admission lock, which serializes
admissions like kubelet's admit handler.
"""

from __future__ import annotations

import heapq
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from google.protobuf import text_format

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.fit.quantity import quantity_ceil

#: ``status.reason`` of a pod the device manager refused.
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"

ContainerKind = Literal["init", "sidecar", "app"]


class PluginCallError(Exception):
    """A call to a plugin failed; the text is what kubelet's Go client reports (``rpc error: ...``)."""


class AllocationError(Exception):
    """The device manager refused a container; the text is kubelet's, without the admission wrapper."""


class PluginEndpoint(Protocol):
    """Kubelet's client for one plugin; both calls raise `PluginCallError`."""

    def get_preferred_allocation(
        self, request: dp.PreferredAllocationRequest
    ) -> dp.PreferredAllocationResponse: ...

    def allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse: ...


@dataclass(frozen=True)
class PluginView:
    """One registered resource as admission needs it, read in one go under the emulator's lock."""

    healthy: frozenset[str]
    #: Device ID -> NUMA nodes, as advertised.
    topology: Mapping[str, tuple[int, ...]]
    #: ``get_preferred_allocation_available`` from GetDevicePluginOptions.
    preferred_available: bool
    #: None once kubelet let go of the plugin's connection.
    endpoint: PluginEndpoint | None


# --------------------------------------------------------------------------- the pod


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    #: "init" runs to completion before the next container starts; "sidecar" is a restartable init.
    kind: ContainerKind
    #: ``resources.limits`` as written in the pod (kubelet iterates limits: extended resources
    #: cannot be overcommitted, so requests equal limits).
    limits: Mapping[str, object]


@dataclass(frozen=True)
class PodSpec:
    uid: str
    name: str
    namespace: str
    #: Kubelet's admission order: init containers in spec order, then app containers.
    containers: tuple[ContainerSpec, ...]
    #: ``metadata.creationTimestamp`` (RFC 3339); "" when absent.
    created: str = ""

    @classmethod
    def from_json(cls, pod: Mapping[str, Any]) -> PodSpec:
        """Read a pod as the API serves it (camelCase JSON)."""
        metadata = pod.get("metadata") or {}
        if not metadata.get("uid"):
            raise ValueError("pod has no metadata.uid")
        spec = pod.get("spec") or {}
        init = [
            _container(container, "sidecar" if container.get("restartPolicy") == "Always" else "init")
            for container in spec.get("initContainers") or []
        ]
        app = [_container(container, "app") for container in spec.get("containers") or []]
        return cls(
            uid=str(metadata["uid"]),
            name=str(metadata.get("name", "")),
            namespace=str(metadata.get("namespace") or "default"),
            containers=(*init, *app),
            created=str(metadata.get("creationTimestamp") or ""),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def long_running(self) -> tuple[ContainerSpec, ...]:
        """Sidecars and app containers: the ones pod-resources reports."""
        return tuple(container for container in self.containers if container.kind != "init")


def _container(container: Mapping[str, Any], kind: ContainerKind) -> ContainerSpec:
    limits = (container.get("resources") or {}).get("limits") or {}
    return ContainerSpec(name=str(container["name"]), kind=kind, limits=dict(limits))


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ContainerAllocation:
    """One checkpoint entry (pod, container, resource), with how kubelet chose its devices."""

    container: str
    resource: str
    #: In the order sent in ``ContainerAllocateRequest.devices_ids``.
    device_ids: tuple[str, ...]
    #: Device ID -> NUMA nodes as advertised at allocation time (kubelet checkpoints them).
    topology: Mapping[str, tuple[int, ...]]
    response: dp.ContainerAllocateResponse
    #: GetPreferredAllocation's answer (first container response); None when kubelet did not ask.
    preferred: tuple[str, ...] | None = None
    #: True when the answer alone supplied every device kubelet still had to pick.
    preferred_used: bool = False

    @property
    def preferred_called(self) -> bool:
        return self.preferred is not None

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs)

    @property
    def mounts(self) -> list[dp.Mount]:
        return list(self.response.mounts)

    @property
    def devices(self) -> list[dp.DeviceSpec]:
        return list(self.response.devices)

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.response.annotations)

    @property
    def cdi_devices(self) -> list[str]:
        return [device.name for device in self.response.cdi_devices]


@dataclass(frozen=True)
class Admission:
    """The outcome of admitting one pod."""

    pod: PodSpec
    admitted: bool
    #: ``UnexpectedAdmissionError`` when refused.
    reason: str = ""
    message: str = ""
    #: Kubelet's order; empty when refused (the pod keeps nothing).
    allocations: tuple[ContainerAllocation, ...] = ()
    #: True when the pod was already in the checkpoint and was replayed without plugin calls.
    replayed: bool = False

    def find(self, container: str, resource: str) -> ContainerAllocation | None:
        for allocation in self.allocations:
            if (allocation.container, allocation.resource) == (container, resource):
                return allocation
        return None

    def allocation(self, container: str, resource: str) -> ContainerAllocation:
        found = self.find(container, resource)
        if found is None:
            raise KeyError(f"{self.pod.key} has no {resource} for container {container!r}")
        return found

    def devices_of(self, resource: str) -> set[str]:
        return _devices(self.allocations, resource)

    def __str__(self) -> str:
        head = f"pod={self.pod.key} uid={self.pod.uid}"
        if not self.admitted:
            return f"{head} reason={self.reason} message={self.message!r}"
        counts = "".join(
            f" {entry.container}:{entry.resource}={len(entry.device_ids)}" for entry in self.allocations
        )
        return head + counts + (" replayed" if self.replayed else "")


def _devices(allocations: Iterable[ContainerAllocation], resource: str) -> set[str]:
    return {device for entry in allocations if entry.resource == resource for device in entry.device_ids}


# --------------------------------------------------------------------------- the device manager


@dataclass
class _PodRun:
    """One admission in progress."""

    pod: PodSpec
    #: The pod's checkpoint entries when kubelet already admitted it.
    previous: Admission | None
    allocations: list[ContainerAllocation] = field(default_factory=list)
    #: Resource -> devices of finished run-to-completion init containers.
    reusable: dict[str, set[str]] = field(default_factory=dict)

    def stored(self, container: str, resource: str) -> ContainerAllocation | None:
        return None if self.previous is None else self.previous.find(container, resource)

    def held(self, resource: str) -> set[str]:
        return _devices(self.allocations, resource)

    def so_far(self) -> Admission:
        """The pod as kubelet's records show it mid-admission: the devices allocated until now."""
        if self.previous is not None:  # re-admitted: kubelet restored its devices from the checkpoint
            return self.previous
        return Admission(self.pod, admitted=True, allocations=tuple(self.allocations))

    def finished(self, container: ContainerSpec) -> None:
        """Kubelet's bookkeeping after a container: init devices become reusable, the others' leave."""
        for entry in self.allocations:
            if entry.container != container.name:
                continue
            pool = self.reusable.setdefault(entry.resource, set())
            if container.kind == "init":
                pool.update(entry.device_ids)
            else:
                pool.difference_update(entry.device_ids)


@dataclass(frozen=True)
class _Choice:
    device_ids: tuple[str, ...]
    preferred: tuple[str, ...] | None
    preferred_used: bool


#: Orders a container's device-plugin resources (given in ``limits`` order) for their Allocate calls.
ResourceOrder = Callable[[Sequence[str]], Sequence[str]]


class GoMapOrder:
    """Kubelet's order: ranging over a Go map, shuffled on every pass (seeded here, to repeat)."""

    def __init__(self, seed: int | None = 0) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, resources: Sequence[str]) -> Sequence[str]:
        shuffled = list(resources)
        with self._lock:
            self._random.shuffle(shuffled)
        return shuffled


def given_first(first: Sequence[str], then: ResourceOrder) -> ResourceOrder:
    """The resources named in `first`, in that order, then the rest in `then`'s order."""

    def order(resources: Sequence[str]) -> Sequence[str]:
        named = [resource for resource in first if resource in resources]
        return [*named, *then([resource for resource in resources if resource not in named])]

    return order


def creation_order(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Kubelet's sort of an ADD batch by ``creationTimestamp`` (equal times keep their order: Go's
    sort of a batch under 13 pods is an insertion sort); pods without one come first."""

    def created(pod: Mapping[str, Any]) -> datetime:
        value = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        return datetime.fromisoformat(value) if value else datetime.min.replace(tzinfo=UTC)

    return sorted(pods, key=created)


class Admitter:
    """Kubelet's device manager: admits pods against the plugins `lookup` finds, keeps the checkpoint.

    `lookup(resource)` returns None for a resource no plugin ever registered. `on_admission` is called
    with every outcome, in order, while the admission lock is held. `resource_order` orders each
    container's Allocate calls (default: `GoMapOrder`).
    """

    def __init__(
        self,
        lookup: Callable[[str], PluginView | None],
        on_admission: Callable[[Admission], None] | None = None,
        resource_order: ResourceOrder | None = None,
    ) -> None:
        self._lookup = lookup
        self._on_admission = on_admission
        self._resource_order = resource_order or GoMapOrder()
        # Kubelet's admit handler takes one pod at a time; held across plugin calls.
        self._serial = threading.Lock()
        # Guards the checkpoint and the pod under admission; never held across a plugin call.
        self._lock = threading.Lock()
        self._pods: dict[str, Admission] = {}
        self._admitting: _PodRun | None = None

    # ---------------------------------------------------------------- queries

    def admissions(self) -> tuple[Admission, ...]:
        """Every admitted pod with its checkpoint entries, in admission order."""
        with self._lock:
            return tuple(self._pods.values())

    def admission(self, pod_uid: str) -> Admission | None:
        with self._lock:
            return self._pods.get(pod_uid)

    def listed(self) -> tuple[Admission, ...]:
        """What kubelet's active pods hold, as pod-resources reads it: every admitted pod, then the
        pod under admission with the devices it got so far."""
        with self._lock:
            run = self._admitting
            admitted = tuple(pod for uid, pod in self._pods.items() if run is None or uid != run.pod.uid)
            return admitted if run is None else (*admitted, run.so_far())

    @property
    def admitting(self) -> bool:
        """A pod is being admitted right now."""
        with self._lock:
            return self._admitting is not None

    def in_use(self, resource: str) -> dict[str, str]:
        """Device ID -> UID of the admitted pod holding it."""
        with self._lock:
            return {device: uid for uid, pod in self._pods.items() for device in pod.devices_of(resource)}

    # ---------------------------------------------------------------- changes

    def admit(self, pod: Mapping[str, Any], resource_order: Sequence[str] = ()) -> Admission:
        """Admit one pod; `resource_order` names resources to allocate first, in that order."""
        spec = PodSpec.from_json(pod)
        order = given_first(resource_order, self._resource_order) if resource_order else self._resource_order
        with self._serial:
            admission = self._admit(spec, order)
            if self._on_admission is not None:
                self._on_admission(admission)
            return admission

    def admit_batch(self, pods: Iterable[Mapping[str, Any]]) -> list[Admission]:
        """One ADD batch: the pods in creation-time order, one at a time."""
        return [self.admit(pod) for pod in creation_order(pods)]

    def forget(self, pod_uid: str) -> Admission | None:
        """Drop a pod's checkpoint entries, freeing its devices; returns what was dropped."""
        with self._lock:
            return self._pods.pop(pod_uid, None)

    def reallocate(self, pod_uid: str, container: str, resource: str) -> dp.ContainerAllocateResponse:
        """Send Allocate again for the checkpointed device IDs and checkpoint the new response.

        Kubelet re-issues Allocate at container start when its checkpoint lacks the container (a race
        after node reboot); there it re-picks devices, here the IDs stay pinned so a test can check that
        the plugin answers the same request the same way. Raises `AllocationError` if the call fails.
        """
        with self._serial:
            pod = self.admission(pod_uid)
            if pod is None:
                raise KeyError(f"no admitted pod with uid {pod_uid!r}")
            entry = pod.allocation(container, resource)
            key = (container, resource)
            response = self._allocate(self._lookup(resource), resource, entry.device_ids)
            with self._lock:
                current = self._pods.get(pod_uid)
                if current is not None:
                    allocations = tuple(
                        replace(item, response=response) if (item.container, item.resource) == key else item
                        for item in current.allocations
                    )
                    self._pods[pod_uid] = replace(current, allocations=allocations)
            return response

    # ---------------------------------------------------------------- admission

    def _admit(self, spec: PodSpec, order: ResourceOrder) -> Admission:
        run = _PodRun(spec, self.admission(spec.uid))
        with self._lock:
            self._admitting = run
        try:
            for container in spec.containers:
                self._admit_container(run, container, order)
                run.finished(container)
        except AllocationError as exc:
            # Kubelet's refusal is final (the pod is terminal, so no longer listed) and its garbage
            # collection frees what the pod got.
            with self._lock:
                self._admitting = None
                self._pods.pop(spec.uid, None)
            message = f"Allocate failed due to {exc}, which is unexpected"
            return Admission(spec, admitted=False, reason=UNEXPECTED_ADMISSION_ERROR, message=message)
        admission = Admission(spec, admitted=True, allocations=tuple(run.allocations))
        with self._lock:
            self._admitting = None
            self._pods[spec.uid] = admission
        return replace(admission, replayed=run.previous is not None)

    def _admit_container(self, run: _PodRun, container: ContainerSpec, order: ResourceOrder) -> None:
        views = {resource: view for resource in container.limits if (view := self._lookup(resource))}
        for resource in order(list(views)):
            required = quantity_ceil(container.limits[resource])
            self._admit_resource(run, container.name, resource, required, views[resource])

    def _admit_resource(
        self, run: _PodRun, container: str, resource: str, required: int, view: PluginView
    ) -> None:
        """Kubelet's checks, in kubelet's order, then the checkpointed devices or new ones."""
        stored = run.stored(container, resource)
        if stored is not None and len(stored.device_ids) != required:
            raise AllocationError(
                f'pod "{run.pod.uid}" container "{container}" changed request for resource "{resource}" '
                f"from {len(stored.device_ids)} to {required}"
            )
        if not view.healthy:
            raise AllocationError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        if stored is not None:
            if not view.healthy.issuperset(stored.device_ids):
                raise AllocationError(
                    "previously allocated devices are no longer healthy; "
                    f"cannot allocate unhealthy devices {resource}"
                )
            run.allocations.append(stored)
        elif required > 0:
            choice = self._choose(run, resource, required, view)
            response = self._allocate(view, resource, choice.device_ids)
            entry = ContainerAllocation(
                container=container,
                resource=resource,
                device_ids=choice.device_ids,
                topology={device: view.topology.get(device, ()) for device in choice.device_ids},
                response=response,
                preferred=choice.preferred,
                preferred_used=choice.preferred_used,
            )
            with self._lock:  # kubelet's podDevices.insert, right after this resource's Allocate
                run.allocations.append(entry)

    def _choose(self, run: _PodRun, resource: str, required: int, view: PluginView) -> _Choice:
        """Kubelet's devicesToAllocate: reusable devices first, then the plugin's preference, then its own."""
        picked = sorted(run.reusable.get(resource, ()))[:required]
        needed = required - len(picked)
        if needed == 0:
            return _Choice(tuple(picked), preferred=None, preferred_used=False)
        candidates = view.healthy - self.in_use(resource).keys() - run.held(resource)
        if len(candidates) < needed:
            raise AllocationError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(candidates)}"
            )
        preferred: tuple[str, ...] | None = None
        if view.preferred_available:
            preferred = self._preferred(view, resource, candidates, picked, required)
            picked += [device for device in dict.fromkeys(preferred) if device in candidates][:needed]
        preferred_used = preferred is not None and len(picked) == required
        # Kubelet's own pick draws from an unordered set; the emulator takes the smallest IDs.
        picked += heapq.nsmallest(required - len(picked), candidates.difference(picked))
        return _Choice(tuple(picked), preferred, preferred_used)

    def _preferred(
        self,
        view: PluginView,
        resource: str,
        candidates: Iterable[str],
        must_include: list[str],
        required: int,
    ) -> tuple[str, ...]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=sorted({*candidates, *must_include}),
                    must_include_deviceIDs=must_include,
                    allocation_size=required,
                )
            ]
        )
        try:
            response = _endpoint(view, resource).get_preferred_allocation(request)
        except PluginCallError as exc:
            raise AllocationError(f"device plugin GetPreferredAllocation rpc failed with err: {exc}") from exc
        if not response.container_responses:
            return ()
        return tuple(response.container_responses[0].deviceIDs)

    def _allocate(
        self, view: PluginView | None, resource: str, device_ids: Iterable[str]
    ) -> dp.ContainerAllocateResponse:
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=device_ids)])
        try:
            response = _endpoint(view, resource).allocate(request)
        except PluginCallError as exc:
            raise AllocationError(str(exc)) from exc
        if not response.container_responses:
            # Kubelet prints the response with Go's %v: the compact text form, empty here.
            shown = text_format.MessageToString(response, as_one_line=True)
            raise AllocationError(f"no containers return in allocation response {shown}")
        return response.container_responses[0]


def _endpoint(view: PluginView | None, resource: str) -> PluginEndpoint:
    if view is None or view.endpoint is None:
        raise AllocationError(f"unknown Device Plugin {resource}")
    return view.endpoint
