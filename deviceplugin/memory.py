"""Process-wide memory settings for the long-running daemon."""

from __future__ import annotations

import ctypes
import gc

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
LARGE_BUFFER_BYTES = 1 << 20


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (the calls below are glibc's), else None. Looked up among the
    symbols the process already has (the interpreter links it): `ctypes.util.find_library` would
    run `ldconfig -p` at every start."""
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def return_large_buffers_to_the_os() -> bool:
    """Serve allocations of 1 MiB and more from mmap, so they go back to the OS when freed.

    ListAndWatch messages run to 3.5 MiB and gRPC copies them per send, on whichever pool thread
    sends. glibc raises its mmap threshold after the first such buffer is freed, and from then on
    keeps them in per-thread arenas: every kubelet restart (new server, new threads) left another
    copy resident, 104 -> 156 MB over 40 restarts. Pinning the threshold stops that. Returns
    False where the C library is not glibc (nothing to do there)."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES))


def trim_heap() -> None:
    """Give the OS back the free pages left scattered in the C heap (after large first lists)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def freeze_startup_objects() -> None:
    """Keep what start-up built (modules, the API client, device lists), which lives as long as
    the process, out of the collector's full passes: with 500 pods on the node a full pass paused
    every thread for 63 ms scanning it, 1 ms after this. Garbage is collected first, so nothing
    unreachable is frozen for good."""
    gc.collect()
    gc.freeze()
