"""A full or read-only `--state-dir` (issue 13, F3): the daemon as a subprocess, its ledger on a
real small filesystem that the test fills, gives back or turns read-only, pods in the API-server
emulator admitted by the kubelet emulator over real sockets.

Before: the Allocate failed with `UNKNOWN: Exception calling application` and no log line, metric,
Event or readiness change, and the outbox thread died on its first write (`Ledger.done`), so no
patch was sent again until a restart, even after space returned."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import NODE, Daemon, eventually
from tests.disks import Disk, failing_ext4, tmpfs
from tests.e2e import test_allocate as share
from tests.e2e import test_vgpu as vgpu

FAILURES = "volcano_gpu_plugin_allocate_failures_total"
STORAGE_ERRORS = "volcano_gpu_plugin_ledger_storage_errors_total"


@pytest.fixture
def disk(workdir: Path) -> Iterator[Disk]:
    """An 8 MiB tmpfs as `--state-dir` (the `start` fixture's `workdir/state`)."""
    with tmpfs(workdir / "state") as mounted:
        yield mounted


def readiness(daemon: Daemon) -> tuple[int, str]:
    return vgpu.get(daemon.metrics_url() + "/readyz")


def failures(daemon: Daemon, reason: str) -> float:
    return vgpu.samples(daemon, FAILURES).get((("reason", reason),), 0.0)


def storage_errors(daemon: Daemon, problem: str) -> float:
    return sum(
        value
        for labels, value in vgpu.samples(daemon, STORAGE_ERRORS).items()
        if ("problem", problem) in labels
    )


def events(
    apiserver: ApiServerEmulator, name: str, reason: str, namespace: str = "ml"
) -> list[dict[str, Any]]:
    return [
        event
        for event in apiserver.list("events", namespace)
        if event["involvedObject"]["name"] == name and event["reason"] == reason
    ]


def node_events(apiserver: ApiServerEmulator, reason: str) -> list[dict[str, Any]]:
    return events(apiserver, NODE, reason, "default")


def rows(path: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(path / "ledger.db")) as db:
        return db.execute("SELECT pod_name, state FROM allocations ORDER BY pod_name").fetchall()


def outbox_size(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path / "ledger.db")) as db:
        return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def pod_patches(apiserver: ApiServerEmulator, name: str) -> int:
    """Patches of the pod the API server accepted."""
    return sum(
        1
        for record in apiserver.requests.records()
        if record.method == "PATCH" and record.path.endswith(f"/pods/{name}") and record.code == 200
    )


def test_a_full_state_dir_refuses_allocate_clearly_and_recovers_when_space_returns(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    disk: Disk,
) -> None:
    daemon = share.launch(start, apiserver, kubelet, workdir)
    share.admit(kubelet, share.make_pod(apiserver, "before", 1024), daemon)
    disk.fill()

    refused = kubelet.admit(share.make_pod(apiserver, "during", 1024))
    assert not refused.admitted
    assert "code = ResourceExhausted" in refused.message, refused.message
    assert "pod ml/during" in refused.message and "disk full" in refused.message, refused.message
    assert str(disk.path) in refused.message, refused.message
    eventually(lambda: len(events(apiserver, "during", "GpuAllocationFailed")) == 1, daemon)
    assert "disk full" in events(apiserver, "during", "GpuAllocationFailed")[0]["message"]
    assert failures(daemon, "ledger-disk-full") == 1
    assert storage_errors(daemon, "disk-full") >= 1
    status, body = readiness(daemon)
    assert status == 503 and "ledger" in body and "disk full" in body, body
    assert "reason=ledger-disk-full" in daemon.output()
    assert "Exception calling application" not in daemon.output()
    eventually(lambda: len(node_events(apiserver, "LedgerUnwritable")) == 1, daemon)

    disk.free()
    eventually(lambda: readiness(daemon) == (200, "ok\n"), daemon)  # no Allocate needed to notice
    eventually(lambda: len(node_events(apiserver, "LedgerWritable")) == 1, daemon)
    # another size: the refused pod stays a candidate of its size until kubelet marks it Failed
    share.admit(kubelet, share.make_pod(apiserver, "after", 2048), daemon)
    eventually(lambda: share.assigned(apiserver, "after"), daemon)
    assert rows(disk.path) == [("after", "allocated"), ("before", "allocated")]  # nothing from "during"


def test_the_outbox_rides_out_a_full_state_dir_and_sends_each_patch_once(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    disk: Disk,
) -> None:
    """A patch sent while the disk is full cannot be marked sent: it is not sent again, and the
    outbox goes on (it used to die there for good)."""
    daemon = share.launch(start, apiserver, kubelet, workdir)
    held = apiserver.faults.hang(method="PATCH", path="/pods/queued")
    share.admit(kubelet, share.make_pod(apiserver, "queued", 1024), daemon)
    eventually(lambda: held.hits >= 1, daemon)  # the outbox's patch is on its way, held there
    disk.fill()
    apiserver.faults.clear(held)  # the patch is applied; the outbox cannot write that down
    eventually(lambda: share.assigned(apiserver, "queued"), daemon)
    eventually(lambda: storage_errors(daemon, "disk-full") >= 1, daemon)  # marking it sent failed
    assert readiness(daemon)[0] == 503

    disk.free()
    eventually(lambda: readiness(daemon) == (200, "ok\n"), daemon)
    share.admit(kubelet, share.make_pod(apiserver, "after", 1024), daemon)
    eventually(lambda: share.assigned(apiserver, "after"), daemon)
    eventually(lambda: outbox_size(disk.path) == 0, daemon)
    assert pod_patches(apiserver, "queued") == 1
    assert rows(disk.path) == [("after", "allocated"), ("queued", "allocated")]
    assert "Traceback" not in daemon.output(), daemon.output()


@pytest.fixture
def ext4(workdir: Path) -> Iterator[Path]:
    """An ext4 `--state-dir` and the file that fails it (see `disks.failing_ext4`)."""
    with failing_ext4(workdir / "state", workdir / "disk.img") as trigger:
        yield trigger


def test_a_read_only_state_dir_refuses_allocate_as_unavailable(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    ext4: Path,
) -> None:
    daemon = share.launch(start, apiserver, kubelet, workdir)
    share.admit(kubelet, share.make_pod(apiserver, "before", 1024), daemon)
    ext4.write_text("test: the disk failed\n")

    refused = kubelet.admit(share.make_pod(apiserver, "during", 1024))
    assert not refused.admitted
    assert "code = Unavailable" in refused.message, refused.message
    assert "pod ml/during" in refused.message and "read-only" in refused.message, refused.message
    eventually(lambda: len(events(apiserver, "during", "GpuAllocationFailed")) == 1, daemon)
    assert failures(daemon, "ledger-read-only") == 1
    assert storage_errors(daemon, "read-only") >= 1
    status, body = readiness(daemon)
    assert status == 503 and "read-only" in body, body
    assert "Exception calling application" not in daemon.output()
