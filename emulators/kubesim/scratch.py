"""Working directories for the simulated cluster (and the tests): short enough for the Unix sockets
made below them, removed on the way out whatever the way."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A socket path is at most 107 bytes; below the root come the directory's name (`/dpsim-` and 8
# random characters, 15 bytes) and a node's kubelet sockets (`/<20-character name>/plugins/
# nvidia-vgpu-memory.sock`, 53 bytes).
LONGEST_ROOT = 48
# The simulated cluster's root holds an mps node's MPS control sockets too, longer still
# (`/mps15/GPU-<36-character uuid>/pipe/control`, 60 bytes).
LONGEST_CLUSTER_ROOT = 32


def short_temp_root(longest: int = LONGEST_ROOT) -> str:
    """Where to make them: $TMPDIR (tempfile's choice) when it leaves room for the sockets (at
    most `longest` bytes), else /tmp."""
    root = tempfile.gettempdir()
    return root if len(root) <= longest else "/tmp"


@contextmanager
def scratch_dir(prefix: str, longest: int = LONGEST_ROOT) -> Iterator[Path]:
    """A new directory under `short_temp_root(longest)`, removed with everything in it when the
    block ends: return, exception, or `signals.Stopped`."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=short_temp_root(longest)))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
