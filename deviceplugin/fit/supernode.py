"""Super-node groups (Volcano's MetaX `gpu-podaffinity`): where the next pod of a job may go so
that every group of its GPUs lies inside one super-node (nodes labelled `volcano.sh/super-node`
with one value: the nodes sharing the fastest interconnect).

A job (its pod group) annotated `gpu-group-size: G` is cut into groups of G GPUs, each inside one
super-node (strict). With `atomic-gpu-group-size: A` too, only each group of A GPUs must lie in
one super-node; groups of G are kept together where they can (a preference, never a refusal).

The rule works per super-node on the job's GPUs already placed there (bound, or assumed by a
bind or a reserve) and its free whole GPUs: a super-node holding `n` of the job's GPUs with
`n % size > 0` holds an open group, which the job's next pods complete before any new group
starts; a new group starts only in a super-node whose free GPUs hold it whole (and whatever its
own open group still needs). Plain data in, plain data out: the extender gathers the counts
(`deviceplugin.extender.supernodes`). docs/supernode.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deviceplugin.fit import amounts, keys, objects
from deviceplugin.fit.errors import RequestError
from deviceplugin.fit.model import GpuState

SUPER_NODE_LABEL = "volcano.sh/super-node"
GROUP_SIZE = "volcano.sh/gpu-group-size"
ATOMIC_GROUP_SIZE = "volcano.sh/atomic-gpu-group-size"
# The keys of Volcano's MetaX chapter, accepted as aliases of ours.
METAX_GROUP_SIZE = "metax-tech.com/gpu-group-size"
METAX_ATOMIC_GROUP_SIZE = "metax-tech.com/atomic-gpu-group-size"
# The resources that count a pod's GPUs (whole cards or vGPUs, one card each).
GPU_COUNTS = (keys.GPU_NUMBER, keys.VGPU_NUMBER, keys.NVIDIA_GPU)

JOIN = 2  # preference: the super-node holds the job's open best-effort group
WHOLE = 1  # preference: the super-node's free GPUs hold a new best-effort group whole


@dataclass(frozen=True, slots=True)
class GroupSizes:
    """A job's group sizes in GPUs; `atomic` 0 when not given (groups of `group` are strict)."""

    group: int
    atomic: int = 0

    @property
    def strict(self) -> int:
        """The size of the groups that must lie inside one super-node."""
        return self.atomic or self.group

    @property
    def strict_key(self) -> str:
        return ATOMIC_GROUP_SIZE if self.atomic else GROUP_SIZE


def _size(annotations: Mapping[str, object], key: str, alias: str) -> int:
    """The size given under `key` or its alias (0 when neither); both, differing, is an error."""
    given = {name: annotations[name] for name in (key, alias) if name in annotations}
    if len(given) == 2 and given[key] != given[alias]:
        raise RequestError(f"{key} {given[key]!r} and {alias} {given[alias]!r} disagree: give one of them")
    if not given:
        return 0
    name, raw = next(iter(given.items()))
    text = raw.strip() if isinstance(raw, str) else ""
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise RequestError(f"{name} must be a positive whole number of GPUs, not {raw!r}")
    return int(text)


def read_sizes(annotations: Mapping[str, object]) -> GroupSizes | None:
    """The pod's group sizes, None when it asks for no group; RequestError naming the annotation
    when a value is not a positive whole number, an alias contradicts our key, or the atomic
    size comes without the group size."""
    group = _size(annotations, GROUP_SIZE, METAX_GROUP_SIZE)
    atomic = _size(annotations, ATOMIC_GROUP_SIZE, METAX_ATOMIC_GROUP_SIZE)
    if atomic and not group:
        raise RequestError(f"{ATOMIC_GROUP_SIZE} {atomic} is given without {GROUP_SIZE}")
    return GroupSizes(group, atomic) if group else None


def pod_gpus(pod: objects.Obj) -> int:
    """The GPUs a pod's containers ask by count (`GPU_COUNTS`: limit, else request); RequestError
    on a malformed amount. Init containers run before them on the same cards: not counted."""
    total = 0
    for container in objects.containers(pod):
        where = f"pod {objects.namespaced_name(pod)} container {container.get('name') or '?'}"
        for name in GPU_COUNTS:
            total += amounts.strict(container, name, where) or 0
    return total


def check_sizes(sizes: GroupSizes, gpus: int, job_gpus: int, job_pods: int) -> None:
    """RequestError unless each size is a multiple of the pod's GPUs and divides the job's total
    (`job_gpus` over `job_pods` pods), and the atomic size divides the group size."""
    if gpus <= 0:
        raise RequestError(
            f"{GROUP_SIZE} counts GPUs, and the pod asks none by count ({', '.join(GPU_COUNTS)})"
        )
    given = [(GROUP_SIZE, sizes.group)] + ([(ATOMIC_GROUP_SIZE, sizes.atomic)] if sizes.atomic else [])
    for key, size in given:
        if size % gpus:
            raise RequestError(f"{key} {size} is not a multiple of the pod's {gpus} GPUs")
        if job_gpus % size:
            raise RequestError(
                f"{key} {size} does not divide the job's {job_gpus} GPUs ({job_pods} pods of its pod group)"
            )
    if sizes.atomic and sizes.group % sizes.atomic:
        raise RequestError(f"{ATOMIC_GROUP_SIZE} {sizes.atomic} does not divide {GROUP_SIZE} {sizes.group}")


def idle_cards(gpus: Iterable[GpuState]) -> int:
    """Healthy cards holding no pod: the free whole GPUs a new group may count on."""
    return sum(1 for gpu in gpus if gpu.health and not gpu.pods)


def _missing(placed: int, size: int) -> int:
    """GPUs an open group of `size` still needs when `placed` of the job's GPUs are in one super-node."""
    return -placed % size


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the job's next pod may go: `allowed` super-nodes, `refusals` saying why each other
    known super-node may not, and `preferred` (best-effort groups only): a level per super-node
    (`JOIN`, `WHOLE`; absent: 0)."""

    allowed: frozenset[str]
    refusals: Mapping[str, str] = field(default_factory=dict)
    preferred: Mapping[str, int] = field(default_factory=dict)


def place(placed: Mapping[str, int], free: Mapping[str, int], sizes: GroupSizes, gpus: int) -> Placement:
    """The super-nodes a pod asking `gpus` GPUs may join. `placed`: the job's GPUs already in each
    super-node; `free`: every super-node's free whole GPUs (its keys are the super-nodes known)."""
    size = sizes.strict
    known = sorted({*free, *placed})
    open_groups = {s: _missing(n, size) for s, n in placed.items() if _missing(n, size)}
    joinable = sorted(s for s, missing in open_groups.items() if missing >= gpus)
    if joinable:  # complete the open group(s) before any new one starts
        shown = ", ".join(f"{s} ({placed[s] % size} of {size} GPUs placed)" for s in joinable)
        why = f"{sizes.strict_key} {size}: the job's open group in super-node {shown} is completed first"
        allowed = frozenset(joinable)
        refusals = {s: why for s in known if s not in allowed}
    else:  # a new group: where the free GPUs hold it whole, and the super-node's own open group
        need = {s: size + open_groups.get(s, 0) for s in known}
        allowed = frozenset(s for s in known if free.get(s, 0) >= need[s])
        refusals = {
            s: f"{sizes.strict_key} {size}: a new group of the job needs {need[s]} free GPUs in one "
            f"super-node; super-node {s} has {free.get(s, 0)}"
            for s in known
            if s not in allowed
        }
    preferred = _preference(placed, free, sizes.group, gpus) if sizes.atomic else {}
    return Placement(allowed, refusals, preferred)


def _preference(placed: Mapping[str, int], free: Mapping[str, int], group: int, gpus: int) -> dict[str, int]:
    """Best-effort groups of `group` GPUs: the job's GPUs fill them in order, so the current group
    is open when the job's total is not a multiple of `group`; its pods go best where the group's
    first GPUs are (`JOIN`). A new group goes best where it fits whole (`WHOLE`)."""
    if sum(placed.values()) % group:
        return {s: JOIN for s, n in placed.items() if n % group and _missing(n, group) >= gpus}
    return {s: WHOLE for s, room in free.items() if room >= group}


def ranked(scores: Sequence[tuple[str, int]], levels: Sequence[int], top: int) -> list[tuple[str, int]]:
    """Node scores (0..`top`, top > 0) with the super-node preference first: each node's `level` (0..JOIN)
    picks a band of the range and its own score orders it inside the band, so a node of a more
    preferred super-node always scores above a node of a less preferred one."""
    bands = JOIN + 1
    width = (top + 1) // bands  # scores per band
    return [
        (name, level * (top + 1 - width) // JOIN + score * (width - 1) // top)
        for (name, score), level in zip(scores, levels, strict=True)
    ]
