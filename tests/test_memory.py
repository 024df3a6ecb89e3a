"""Process memory settings of the daemon (the RSS they save is measured by bench/daemon.py)."""

from __future__ import annotations

import gc
import platform
import weakref

import pytest

from deviceplugin import memory


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_freezing_collects_unreachable_cycles_first_and_keeps_the_rest_out_of_collections() -> None:
    garbage = Cycle()
    gone = weakref.ref(garbage)
    kept = Cycle()
    del garbage
    try:
        memory.freeze_startup_objects()
        assert gone() is None  # an unreachable cycle is freed, not frozen forever
        assert gc.get_freeze_count() > 0 and kept.me is kept
    finally:
        gc.unfreeze()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting exists only in glibc")
def test_large_buffers_are_pinned_to_mmap_on_glibc() -> None:
    assert memory.return_large_buffers_to_the_os()
