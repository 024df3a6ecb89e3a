"""Per-card pod filters: GPU type (`nvidia.com/use-gputype`, `nouse-gputype`) and GPU UUID
(`volcano.sh/vgpu-use-gpuuuid`, `vgpu-nouse-gpuuuid`).

The filters are compiled once per pod (`TypeFilter.of`, `UuidFilter.of`) so the per-card check in
the fit loop is a few comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deviceplugin.fit import keys
from deviceplugin.fit.model import Compat, is_volcano_compat


def _items(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


@dataclass(frozen=True, slots=True)
class TypeFilter:
    """Card-type allow/deny lists, upper-cased; None means the annotation imposes nothing.

    Volcano (compat): `use` wins outright when present (then `nouse` is not read), items are not
    trimmed, and an empty item (`"A100,"`) matches every card. Default: both lists apply, items
    are trimmed and empty items ignored.
    """

    use: tuple[str, ...] | None
    nouse: tuple[str, ...] | None
    volcano: bool

    @classmethod
    def of(cls, annotations: Mapping[str, str], volcano: bool) -> TypeFilter:
        use = annotations.get(keys.USE_GPUTYPE)
        nouse = annotations.get(keys.NOUSE_GPUTYPE)
        if volcano:
            return cls(
                use=None if use is None else tuple(use.upper().split(",")),
                nouse=None if nouse is None else tuple(nouse.upper().split(",")),
                volcano=True,
            )
        use_items = _items(use.upper()) if use else ()
        nouse_items = _items(nouse.upper()) if nouse else ()
        return cls(use=use_items or None, nouse=nouse_items or None, volcano=False)

    @property
    def active(self) -> bool:
        return self.use is not None or self.nouse is not None

    def allows(self, card_type: str) -> bool:
        upper = card_type.upper()
        if self.use is not None:
            if not any(item in upper for item in self.use):
                return False
            if self.volcano:
                return True
        return self.nouse is None or not any(item in upper for item in self.nouse)


@dataclass(frozen=True, slots=True)
class UuidFilter:
    """Exact-match UUID allow and deny lists (items trimmed, empties dropped; deny wins)."""

    allow: frozenset[str]
    deny: frozenset[str]

    @classmethod
    def of(cls, annotations: Mapping[str, str]) -> UuidFilter:
        return cls(
            allow=frozenset(_items(annotations.get(keys.VGPU_USE_UUID) or "")),
            deny=frozenset(_items(annotations.get(keys.VGPU_NOUSE_UUID) or "")),
        )

    @property
    def active(self) -> bool:
        return bool(self.allow or self.deny)

    def allows(self, uuid: str) -> bool:
        if not uuid:
            return not self.active
        return (not self.allow or uuid in self.allow) and uuid not in self.deny


def type_allowed(annotations: Mapping[str, str], card_type: str, compat: Compat = None) -> bool:
    """Whether the pod's GPU-type annotations let it use a card of `card_type`."""
    return TypeFilter.of(annotations, is_volcano_compat(compat)).allows(card_type)


def uuid_allowed(annotations: Mapping[str, str], uuid: str, compat: Compat = None) -> bool:
    """Whether the pod's GPU-UUID annotations let it use the card `uuid` (same rule in both modes)."""
    is_volcano_compat(compat)
    return UuidFilter.of(annotations).allows(uuid)
