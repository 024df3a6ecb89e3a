"""The device families by strategy: the one place a strategy name picks code (docs/families.md).

The Ascend families are not picked by strategy: there is one per chip the `vnpus` configuration
names (`ascend_families`), next to whichever GPU strategy a node runs."""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.fit.errors import unknown_strategy
from deviceplugin.fit.families.ascend import AscendFamily, ascend_families
from deviceplugin.fit.families.gpushare import NumberFamily, ShareFamily
from deviceplugin.fit.families.vgpu import VgpuFamily
from deviceplugin.fit.families.whole import WholeFamily
from deviceplugin.fit.family import DeviceFamily, Family
from deviceplugin.fit.keys import Strategy

FAMILIES: Mapping[Strategy, Family] = {
    family.strategy: family for family in (ShareFamily(), NumberFamily(), VgpuFamily(), WholeFamily())
}
_BY_NAME: dict[str, Family] = dict(FAMILIES.items())


def family_of(strategy: str) -> Family:
    """The family of `strategy`; ConfigError naming the strategies for any other string."""
    family = _BY_NAME.get(strategy)
    if family is None:
        raise unknown_strategy(strategy)
    return family


__all__ = ["FAMILIES", "AscendFamily", "DeviceFamily", "Family", "ascend_families", "family_of"]
