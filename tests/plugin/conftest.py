"""Allocate rigs, one per strategy (see `rig`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.plugin.rig import Rig, close_rig, make_rig


@pytest.fixture
def share(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[Rig]:
    rig = make_rig(tmp_path, apiserver, "share")
    yield rig
    close_rig(rig)


@pytest.fixture
def number(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[Rig]:
    rig = make_rig(tmp_path, apiserver, "number")
    yield rig
    close_rig(rig)


@pytest.fixture
def vgpu(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[Rig]:
    rig = make_rig(tmp_path, apiserver, "vgpu")
    yield rig
    close_rig(rig)
