"""Fixtures for the emulator tests: a short temporary root and a check for leaked threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubesim.scratch import scratch_dir
from tests.sim.apiserver_helpers import new_threads
from tests.sim.kubectl import MISSING, find_kubectl


@pytest.fixture
def root() -> Iterator[Path]:
    with scratch_dir("sim-") as path:  # Unix socket paths must stay short
        yield path


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Every thread a test started has ended soon after it (grpc's helpers need a moment)."""
    before = set(threading.enumerate())
    yield
    assert [thread.name for thread in new_threads(before)] == []


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    found = find_kubectl()
    if found is None:
        pytest.skip(MISSING)
    return found
