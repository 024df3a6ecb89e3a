"""What the extender keeps of each node and pod in its caches: the fields its decisions read.

The node and pod caches apply `extender_node` and `extender_pod` (their `slim=` hook) to every
object they list or watch, before they store it and before the inventory sees it. The extender
caches every node and every pod of the cluster; as the API serves them a node carries images,
conditions and node info, a pod managedFields, env, volumes and container statuses: 15-25 KB of
Python objects each, and 304 MB for 20,000 nodes with 80,000 pods, read by nobody here. Kept:

- node: metadata.name; the labels and annotations of the GPU domains (`KEPT_DOMAINS`: the
  strategy label, the vGPU registration, unhealthy GPUs, the memory factor, the GPU topology
  (one string for every node publishing the same), the Ascend registrations and
  `hami-vnpu-core`); the GPU and Ascend resources of status.capacity and status.allocatable
  (those of the same domains);
- pod: metadata name, namespace, uid, deletionTimestamp and the labels and annotations of the
  GPU and pod-group domains; spec.nodeName; per container and init container its name and the
  limits and requests of its resources (a vGPU request may be given as a request); status.phase.

A field of an unexpected shape, or a label or annotation whose value is not a string, is kept as
served, so the fit's readers still report the object as malformed. Nothing kept is an object of
the one served (strings are copied): one served string left alive would pin the allocator arena
it was parsed into, with the rest of that list. Every object kept is a `Record` (read-only
mappings at a third of a dict's size); the containers of pods from one template, the resources and
labels of nodes of one model and pods' phases are one object for all of them (a bounded memo).
The extender keeps 20,000 nodes with 80,000 pods in 6.4 (share) to 7.3 (vGPU) KB per node with its
pods this way (bench/extender.py).
Cached objects are read-only: readers copy to change (`service._bound`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any, cast

from deviceplugin.fit.topology import TOPOLOGY_KEY
from deviceplugin.kube.owned import owned

Obj = Mapping[str, Any]

# hami.io and huawei.com: the Ascend registrations, ledger and resources; a key without a domain
# is its own domain here (`hami-vnpu-core`, the node's hami-core switch).
KEPT_DOMAINS = frozenset(
    {
        "volcano.sh",
        "scheduling.volcano.sh",
        "scheduling.k8s.io",
        "nvidia.com",
        "hami.io",
        "huawei.com",
        "hami-vnpu-core",
    }
)
_POD_METADATA = ("name", "namespace", "uid", "deletionTimestamp")
_RESOURCES = ("limits", "requests")
_SHARED_LIMIT = 4096  # distinct shared values remembered; past it the memo starts afresh

_memo: dict[str, Any] = {}
_RECORD_TYPES = 512  # key sets given a class of their own; objects of others stay dicts
_SLOTS = tuple(f"_{n}" for n in range(32))


class Record(Mapping[str, Any]):
    """A read-only JSON object in a third of a dict's bytes (four keys: 64 bytes, a dict 224): an
    object of a class made per key set (`record`), which names the keys, holding the values in
    slots."""

    __slots__ = ()
    _keys: tuple[str, ...] = ()

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, _SLOTS[self._keys.index(key)])
        except ValueError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, _SLOTS[self._keys.index(key)]) if key in self._keys else default

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


_record_types: dict[tuple[str, ...], type[Record]] = {}


def record(items: Mapping[str, Any]) -> Mapping[str, Any]:
    """`items` as a `Record`; as a dict past `_RECORD_TYPES` key sets or `_SLOTS` keys."""
    keys = tuple(items)
    kind = _record_types.get(keys)
    if kind is None:
        if len(_record_types) >= _RECORD_TYPES or len(keys) > len(_SLOTS):
            return dict(items)
        namespace = {"__slots__": _SLOTS[: len(keys)], "_keys": keys}
        kind = _record_types[keys] = type("Record", (Record,), namespace)
    made = kind()
    for slot, value in zip(_SLOTS, items.values(), strict=False):
        setattr(made, slot, value)
    return made


def _compact(value: Any) -> Any:
    """`value` with every object in it a `Record`. Lists are left as they are: readers check for
    one, and the lists kept here are shared already (containers) or kept as served."""
    if type(value) is dict:
        return record({key: _compact(item) for key, item in value.items()})
    return value


def _shared(value: Any) -> Any:
    """One object for equal values: the containers of pods from one template, nodes of one model's
    resources and labels, pods' phases."""
    key = json.dumps(value, sort_keys=True)  # 1, 1.0 and true stay apart, as readers tell them
    found = _memo.get(key)
    if found is None:
        if len(_memo) >= _SHARED_LIMIT:
            _memo.clear()
        compact = [_compact(item) for item in value] if type(value) is list else _compact(value)
        found = _memo[key] = compact
    return found


def _domains(value: Any) -> Any:
    """The entries of a labels, annotations or resources map whose key is in `KEPT_DOMAINS`."""
    if not isinstance(value, Mapping):
        return owned(value)
    return {
        sys.intern(owned(key)): owned(item)
        for key, item in value.items()
        if type(item) is not str or key.partition("/")[0] in KEPT_DOMAINS
    }


def _kept(value: Any, fields: tuple[str, ...], domains: tuple[str, ...], shared: tuple[str, ...] = ()) -> Any:
    """A metadata or status map with only `fields` (copied) and the `KEPT_DOMAINS` entries of
    `domains` (shared when in `shared`); a domain map left empty is dropped (readers take an
    absent map as empty)."""
    if not isinstance(value, Mapping):
        return owned(value)
    # A pod's name is its own: interned, it would only grow the interpreter's table of them.
    kept = {name: owned(value[name], intern=name != "name") for name in fields if name in value}
    for name in domains:
        if name in value:
            section = _domains(value[name])
            if section != {}:
                kept[name] = _shared(section) if name in shared else section
    return kept


def _container(container: Any) -> Any:
    if not isinstance(container, Mapping):
        return owned(container)
    kept: dict[str, Any] = {"name": owned(container["name"])} if "name" in container else {}
    resources = container.get("resources")
    if isinstance(resources, Mapping):
        kept["resources"] = {key: owned(resources[key]) for key in _RESOURCES if key in resources}
    elif resources is not None:
        kept["resources"] = owned(resources)
    return kept


def _pod_spec(spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        return owned(spec)
    kept: dict[str, Any] = {}
    node = spec.get("nodeName")
    if node is not None:  # one string per node name, however many pods name it
        kept["nodeName"] = sys.intern(owned(node)) if type(node) is str else owned(node)
    for key in ("containers", "initContainers"):
        if key in spec:
            containers = spec[key]
            if isinstance(containers, list):
                kept[key] = _shared([_container(container) for container in containers])
            else:
                kept[key] = owned(containers)
    return kept


def _top(kept: dict[str, Any]) -> dict[str, Any]:
    """The object itself as a `Record` too (a dict and its key table cost 184 bytes, a record of
    three fields 56). The caches type what they keep as the dict they were served; cached
    objects are read-only (see the module's docstring), so only the type says dict."""
    return cast(dict[str, Any], record(kept))


def extender_node(node: Obj) -> dict[str, Any]:
    """The node reduced to what the extender reads (see the module's docstring)."""
    kept: dict[str, Any] = {}
    if "metadata" in node:
        meta = _kept(node["metadata"], (), ("labels", "annotations"), ("labels",))
        notes = meta.get("annotations") if isinstance(meta, dict) else None
        if isinstance(notes, dict) and type(notes.get(TOPOLOGY_KEY)) is str:
            # Nodes of one model publish the same topology text (~280 bytes for 8 GPUs): one string.
            notes[TOPOLOGY_KEY] = sys.intern(notes[TOPOLOGY_KEY])
        name = node["metadata"].get("name") if isinstance(node["metadata"], Mapping) else None
        if name is not None:  # the node's pods name it too: one string for all
            meta["name"] = sys.intern(owned(name)) if type(name) is str else owned(name)
        kept["metadata"] = _compact(meta)
    if "status" in node:
        resources = ("capacity", "allocatable")
        kept["status"] = _compact(_kept(node["status"], (), resources, resources))
    return _top(kept)


def extender_pod(pod: Obj) -> dict[str, Any]:
    """The pod reduced to what the extender reads (see the module's docstring)."""
    kept: dict[str, Any] = {}
    if "metadata" in pod:
        meta = _kept(pod["metadata"], _POD_METADATA, ("labels", "annotations"), ("labels",))
        kept["metadata"] = _compact(meta)
    if "spec" in pod:
        kept["spec"] = _compact(_pod_spec(pod["spec"]))
    if "status" in pod:
        status = _kept(pod["status"], ("phase",), ())
        kept["status"] = _shared(status) if isinstance(status, dict) else status
    return _top(kept)
