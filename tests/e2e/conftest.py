"""End-to-end tests: the real daemon as a subprocess, the kubelet emulator, the API emulator."""

from __future__ import annotations

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.daemons import NODE


@pytest.fixture
def apiserver(apiserver: ApiServerEmulator) -> ApiServerEmulator:
    """The emulator with the daemon's node and the namespace the tests' pods live in."""
    apiserver.create("nodes", {"metadata": {"name": NODE}})
    apiserver.create("namespaces", {"metadata": {"name": "ml"}})
    return apiserver
