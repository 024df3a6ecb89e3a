"""GPUs a node keeps out of sharing (`--exclude-gpus`; HAMi's per-node `filterdevices`): they are
never advertised to kubelet, registered with the scheduler, watched or counted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deviceplugin.gpu.base import GpuInfo


@dataclass(frozen=True, slots=True)
class GpuExclusion:
    uuids: frozenset[str] = frozenset()
    indices: frozenset[int] = frozenset()  # NVML indices

    def excludes(self, gpu: GpuInfo) -> bool:
        return gpu.uuid in self.uuids or gpu.index in self.indices

    def unmatched(self, gpus: Sequence[GpuInfo]) -> list[str]:
        """Entries that name no GPU of this node (a typo, or a card that is gone)."""
        uuids = {gpu.uuid for gpu in gpus}
        indices = {gpu.index for gpu in gpus}
        return sorted(self.uuids - uuids) + [str(index) for index in sorted(self.indices - indices)]

    def __str__(self) -> str:
        return ",".join([*sorted(self.uuids), *map(str, sorted(self.indices))])


def parse_exclusion(value: object) -> GpuExclusion:
    """`GPU-…,1,3`: UUIDs and NVML indices, comma-separated (a YAML list works too)."""
    items = value if isinstance(value, list) else [value]
    uuids: set[str] = set()
    indices: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise ValueError(f"expected GPU UUIDs or indices, got {type(item).__name__}")
        for entry in (part.strip() for part in str(item).split(",")):
            if entry.isascii() and entry.isdigit():
                indices.add(int(entry))
            elif entry.startswith("GPU-") and not any(char.isspace() for char in entry):
                uuids.add(entry)
            else:
                raise ValueError(f"{entry!r} is neither a GPU UUID (GPU-…) nor an index")
    return GpuExclusion(frozenset(uuids), frozenset(indices))
