"""HAMi-core's files on the host (`--hook-path`), which vGPU containers get mounted (SPEC §3.2).

- `libvgpu.so`: the HAMi-core library, installed by the operator (the plugin only checks for it).
- `ld.so.preload`: one line naming the library where the container sees it; written here.
- `vgpu/containers/<pod UID>_<container>/`: each container's shared cache, made as its pod comes
  (`make_ahead`, from the pod cache's thread: the Allocate then hands it out without a system
  call) or else at Allocate, and kept while a live ledger row's response mounts it. That is not
  always the row's own pod: after a same-count swap is corrected, a row moves to the pod whose
  container really holds it, with the directory it was given at Allocate, so directories go by
  what is mounted, not by UID. One made ahead goes with its pod when no Allocate took it.
- `vgpu/lock/`: the lock directory HAMi-core's processes share on the node.
- `vgpu/ready/`: empty directories made beforehand (`refill`), so that making a cache directory
  is one rename, where mkdir waited on the file system's journal (0.14 ms and more while the
  ledger commits to the same disk). Made anew by `prepare`; never mounted, so never a
  container's state.
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.logs import get_log

log = get_log(__name__)

# Where the container sees each file (HAMi-core's own conventions).
CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_CACHE_DIR = "/tmp/vgpu"
CONTAINER_LOCK_DIR = "/tmp/vgpulock"
SHARED = 0o777  # written by whatever user the container runs as
READY = 16  # empty directories kept in `ready`: more than the containers admitted between two pod events


class HookPath:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.library = root / "libvgpu.so"
        self.preload = root / "ld.so.preload"
        self.containers = root / "vgpu" / "containers"
        self._containers = str(self.containers)
        self.lock = root / "vgpu" / "lock"
        self.ready = root / "vgpu" / "ready"
        self.found_dirs = False  # container cache directories were there when `prepare` ran
        self._stock: collections.deque[str] = collections.deque()  # paths under `ready`
        self._names = itertools.count()
        self._filling = threading.Lock()  # one refill at a time (every vGPU allocator calls it)
        self._ahead: set[str] = set()  # cache directories made ahead that no Allocate took yet
        self._lock = threading.Lock()  # `_ahead` and the directories it names change together

    def prepare(self) -> None:
        """Create the directories and the preload file (kept when present: an operator may have
        written their own)."""
        for directory in (self.containers, self.lock):
            directory.mkdir(parents=True, exist_ok=True)
        self.found_dirs = any(self.containers.iterdir())
        os.chmod(self.lock, SHARED)
        shutil.rmtree(self.ready, ignore_errors=True)  # an earlier run's stock, made anew
        self.ready.mkdir()
        self._stock.clear()
        self.refill()
        if not self.preload.exists():
            self.preload.write_text(CONTAINER_LIBRARY + "\n")
        if not self.library.is_file():
            log.warning("HAMi-core library missing: vGPU containers cannot start", path=str(self.library))

    def container_path(self, pod_uid: str, container: str) -> str:
        """Where the container's cache directory is (see `container_dir`): `str(containers /
        name)`, joined as a string (a third of the time); neither part holds a '/' (the API
        server makes the UID, a container name is a DNS label)."""
        return f"{self._containers}/{pod_uid}_{container}"

    def container_dir(self, pod_uid: str, container: str) -> str:
        """The container's cache directory, empty (a stale one from an earlier pod incarnation
        would hand it another container's state): the one made ahead for it, as it is (nothing
        mounts it before this), else made here."""
        path = self.container_path(pod_uid, container)
        with self._lock:
            if path in self._ahead:
                self._ahead.remove(path)
            else:
                self._make(path)
        return path

    def make_ahead(self, pod_uid: str, container: str) -> None:
        """Make the container's cache directory before its Allocate. Not when one is there
        already (a stale one, which `container_dir` empties) or cannot be made (`container_dir`
        then reports why)."""
        path = self.container_path(pod_uid, container)
        with self._lock:
            if path in self._ahead or os.path.lexists(path):
                return
            try:
                self._make(path)
            except OSError:
                return
            self._ahead.add(path)

    def drop_ahead(self, pod_uid: str) -> None:
        """Remove the directories made ahead for the pod that no Allocate took: it is gone or
        finished, and none will."""
        prefix = self.container_path(pod_uid, "")
        with self._lock:
            for path in [path for path in self._ahead if path.startswith(prefix)]:
                self._ahead.remove(path)
                shutil.rmtree(path, ignore_errors=True)

    def _make(self, path: str) -> None:
        """An empty directory of mode `SHARED` at `path`: a ready one renamed into place (which
        replaces an empty stale one too), else made here; a stale one with files goes first."""
        ready = self._take()
        if ready is not None:
            if _renamed(ready, path):
                return
            shutil.rmtree(path, ignore_errors=True)
            if _renamed(ready, path):
                return
            shutil.rmtree(ready, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        Path(path).mkdir(parents=True)
        os.chmod(path, SHARED)

    def refill(self) -> None:
        """Make empty cache directories ahead (mode as `container_dir` gives them) up to `READY`;
        called from the pod cache's thread as pods come and change. One that cannot be made
        (a full disk) is left to `container_dir`, whose Allocate reports the error."""
        with self._filling:
            while len(self._stock) < READY:
                path = f"{self.ready}/{next(self._names)}"
                try:
                    os.mkdir(path)
                    os.chmod(path, SHARED)
                except OSError:
                    return
                self._stock.append(path)

    def _take(self) -> str | None:
        try:
            return self._stock.popleft()
        except IndexError:
            return None

    def keep_mounted(self, responses: Iterable[bytes]) -> None:
        """Remove every cache directory that none of `responses` (live ledger rows' Allocate
        responses) mounts: released pods, and Allocates that crashed before their ledger write;
        not one made ahead for a container still to be served."""
        if not self.containers.is_dir():
            return
        mounted = {
            mount.host_path
            for response in responses
            for mount in pb.ContainerAllocateResponse.FromString(response).mounts
            if mount.container_path == CONTAINER_CACHE_DIR
        }
        for path in self.containers.iterdir():
            if str(path) in mounted:
                continue
            with self._lock:  # made ahead meanwhile: not removed
                if str(path) in self._ahead:
                    continue
                shutil.rmtree(path, ignore_errors=True)
            log.info("vgpu cache dir removed", path=str(path))


def _renamed(source: str, target: str) -> bool:
    try:
        os.rename(source, target)
    except OSError:
        return False
    return True
