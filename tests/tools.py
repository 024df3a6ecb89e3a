"""The real command-line tools some tests run (kubectl, helm): the releases `make test` installs
into the venv (scripts/install_kubectl.py), else the ones on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def find_tool(name: str) -> str | None:
    """The venv's `name` (the release the tests are written for), else one on PATH."""
    if os.access(VENV_BIN / name, os.X_OK):
        return str(VENV_BIN / name)
    return shutil.which(name)


def missing(name: str) -> str:
    """The reason to skip a test that needs `name` and has none."""
    return (
        f"no {name}: `make test` installs the release the tests are written for as {VENV_BIN / name} "
        "(scripts/install_kubectl.py), and none is on PATH"
    )
