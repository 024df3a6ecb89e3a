"""What the node daemon keeps of each pod on its node: the fields it decides on, nothing else.

The pod cache applies `daemon_pod` to every pod it lists or watches (`PodCache(slim=...)`), before
it stores the pod and before a listener sees it. A pod as the API serves it carries managedFields,
owner references, images, commands, env, probes, volumes and a status with conditions: 15-25 KB
of Python objects each, read by nobody here. What is kept:

- metadata: name, namespace, uid, creationTimestamp, deletionTimestamp and the annotations under
  `volcano.sh/` (every pod annotation the daemon reads is Volcano's; the pod-group names and the
  GPU type filters are the scheduler's to read, not the node's);
- spec: nodeName; per container and init container its name, restartPolicy (a sidecar is listed
  by pod-resources), `resources.limits` (the requests are not read: Volcano's protocol is limits)
  and, from env, only a `CUDA_DISABLE_CONTROL` entry (vGPU: no HAMi-core mounts);
- status: phase.

A field of an unexpected shape is kept as served, so the readers in `deviceplugin.fit.objects`
still report the pod as malformed. The spec and status parts that pods from one template share
are one object for all of them (bounded memo), and repeated strings (annotation keys, names,
namespaces, quantities) are interned: what stays per pod is its identity and annotations. The
cache's objects are read-only: every reader copies before it changes anything (`as_written`).

Nothing kept is an object of the pod as served, strings included (`_own` copies them): one such
string left alive pins the whole 1 MiB allocator arena it was parsed into, among the other pods of
the same list, and the daemon started with 500 pods on its node kept the 10 MB their list had
taken while it was parsed.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from typing import Any

from deviceplugin.kube.owned import owned

Obj = Mapping[str, Any]

KEPT_ANNOTATION_DOMAIN = "volcano.sh"
_METADATA = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
_SHARED_LIMIT = 1024  # distinct specs remembered; past it the memo starts afresh

_shared: dict[Hashable, Any] = {}


def _kept_annotation(key: str, value: Any) -> bool:
    # A value that is not a string is kept whatever its key: the readers reject the pod for it.
    return type(value) is not str or key.partition("/")[0] == KEPT_ANNOTATION_DOMAIN


def _metadata(meta: Any) -> Any:
    if not isinstance(meta, Mapping):
        return owned(meta)
    kept = {key: owned(meta[key]) for key in _METADATA if key in meta}
    notes = meta.get("annotations")
    if isinstance(notes, Mapping):
        kept["annotations"] = {
            sys.intern(owned(k)): owned(v) for k, v in notes.items() if _kept_annotation(k, v)
        }
    elif notes is not None:
        kept["annotations"] = owned(notes)
    return kept


# A vGPU container with this env entry gets no HAMi-core mounts (plugin.vgpu).
DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"


def disables_control(env: Any) -> bool:
    """Whether a container's env (a list holding an entry of that name) sets DISABLE_CONTROL: all
    the vGPU reader asks of env, so all the pod cache keeps of it."""
    return isinstance(env, list) and any(
        isinstance(item, Mapping) and item.get("name") == DISABLE_CONTROL for item in env
    )


def _container(container: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {
        key: owned(container[key]) for key in ("name", "restartPolicy") if key in container
    }
    resources = container.get("resources")
    if isinstance(resources, Mapping):
        if resources.get("limits") is not None:
            kept["resources"] = {"limits": owned(resources["limits"])}
    elif resources is not None:
        kept["resources"] = owned(resources)
    if disables_control(container.get("env")):
        kept["env"] = [{"name": DISABLE_CONTROL}]
    return kept


def _containers(containers: Any) -> Any:
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        return owned(containers)
    return [_container(container) for container in containers]


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in equal for equal JSON values (TypeError for anything else)."""
    if isinstance(value, Mapping):
        return ("{", tuple(sorted((key, _frozen(item)) for key, item in value.items())))
    if isinstance(value, list):
        return ("[", tuple(_frozen(item) for item in value))
    hash(value)
    return (type(value), value)  # 1, 1.0 and True are equal, but not the same value to a reader


def _share(value: Any) -> Any:
    """One object for equal values (pods of one template hold the same spec)."""
    try:
        key = _frozen(value)
    except TypeError:
        return value
    found = _shared.get(key)
    if found is None:
        if len(_shared) >= _SHARED_LIMIT:
            _shared.clear()
        found = _shared[key] = value
    return found


def _spec(spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        return owned(spec)
    kept: dict[str, Any] = {}
    if "nodeName" in spec:
        kept["nodeName"] = owned(spec["nodeName"])
    for key in ("containers", "initContainers"):
        if key in spec:
            kept[key] = _containers(spec[key])
    return _share(kept)


def _status(status: Any) -> Any:
    if not isinstance(status, Mapping):
        return owned(status)
    return _share({"phase": owned(status["phase"])} if "phase" in status else {})


def daemon_pod(pod: Obj) -> dict[str, Any]:
    """The pod reduced to what the daemon reads (see the module's docstring)."""
    kept: dict[str, Any] = {}
    for key, slim in (("metadata", _metadata), ("spec", _spec), ("status", _status)):
        if key in pod:
            kept[key] = slim(pod[key])
    return kept
