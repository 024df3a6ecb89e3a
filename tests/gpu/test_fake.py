"""FakeBackend: spec parsing, stable UUIDs, in-process and events-file fault injection, threads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.gpu.base import BackendError, EnumerationError, GpuInfo, WaitError, XidEvent
from deviceplugin.gpu.fake import FAKE_MODEL, FakeBackend, fake_uuid
from deviceplugin.gpu.load import load_backend
from deviceplugin.gpu.nvml import NvmlBackend
from tests.kube.waiting import wait_for

UUID_SHAPE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
BUS_ID_SHAPE = re.compile(r"00000000:[0-9A-F]{2}:00\.0")
UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-66666666-7777-8888-9999-000000000000"


def write_json(tmp_path: Path, document: Any) -> str:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(document))
    return str(path)


def gpu_entry(uuid: object = UUID_A, **extra: Any) -> dict[str, Any]:
    return {"uuid": uuid, "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, **extra}


# --- COUNTxMIB specs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "count", "memory_mib"),
    [
        pytest.param("2x10989", 2, 10989, id="two"),
        pytest.param("8x143771", 8, 143771, id="eight-h200"),
        pytest.param("1x1", 1, 1, id="smallest"),
        pytest.param("64x80", 64, 80, id="most"),
        pytest.param("3X100", 3, 100, id="upper-x"),
    ],
)
def test_count_spec(spec: str, count: int, memory_mib: int) -> None:
    inventory = FakeBackend.from_spec(spec).inventory()
    assert inventory.errors == ()
    assert [gpu.index for gpu in inventory.gpus] == list(range(count))
    for gpu in inventory.gpus:
        assert gpu.model == FAKE_MODEL
        assert gpu.memory_mib == memory_mib
        assert gpu.minor == gpu.index
        assert gpu.numa is None
        assert not gpu.mig_enabled
        assert UUID_SHAPE.fullmatch(gpu.uuid)
        assert gpu.pci_bus_id is not None and BUS_ID_SHAPE.fullmatch(gpu.pci_bus_id)
    assert len({gpu.uuid for gpu in inventory.gpus}) == count
    assert len({gpu.pci_bus_id for gpu in inventory.gpus}) == count


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        pytest.param("0x100", "GPU count '0'", id="zero-count"),
        pytest.param("65x100", "GPU count '65'", id="too-many"),
        pytest.param("-1x100", "GPU count '-1'", id="negative-count"),
        pytest.param("x100", "GPU count ''", id="no-count"),
        pytest.param("2x0", "memory '0'", id="zero-memory"),
        pytest.param("2x-5", "memory '-5'", id="negative-memory"),
        pytest.param("2x", "memory ''", id="no-memory"),
        pytest.param("2xabc", "neither COUNTxMIB", id="garbage-memory"),
        pytest.param("", "neither COUNTxMIB", id="empty"),
        pytest.param("/nonexistent/gpus.json", "neither COUNTxMIB", id="missing-file"),
    ],
)
def test_bad_count_spec(spec: str, problem: str) -> None:
    with pytest.raises(BackendError) as caught:
        FakeBackend.from_spec(spec)
    assert f"fake GPU spec {spec!r}" in str(caught.value)
    assert problem in str(caught.value)


def test_uuids_are_stable_and_depend_on_the_index_only() -> None:
    first = [gpu.uuid for gpu in FakeBackend.from_spec("4x100").inventory().gpus]
    again = [gpu.uuid for gpu in FakeBackend.from_spec("4x100").inventory().gpus]
    bigger = [gpu.uuid for gpu in FakeBackend.from_spec("2x999").inventory().gpus]
    assert first == again
    assert bigger == first[:2]
    assert first == [fake_uuid(index) for index in range(4)]
    assert len(set(first)) == 4


def test_uuids_are_stable_across_processes() -> None:
    code = "from deviceplugin.gpu.fake import fake_uuid; print(fake_uuid(3))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == fake_uuid(3)


# --- JSON specs ------------------------------------------------------------------------------


def test_json_spec(tmp_path: Path) -> None:
    spec = write_json(
        tmp_path,
        [
            gpu_entry(UUID_A, numa=1, minor=7, pci_bus_id="00000000:3B:00.0", mig_enabled=True),
            gpu_entry(UUID_B, numa=None),
        ],
    )
    inventory = FakeBackend.from_spec(spec).inventory()
    assert inventory.errors == ()
    assert inventory.gpus == (
        GpuInfo(0, UUID_A, "NVIDIA A100-SXM4-80GB", 81920, 7, "00000000:3B:00.0", 1, True),
        GpuInfo(1, UUID_B, "NVIDIA A100-SXM4-80GB", 81920, 1, "00000000:02:00.0", None, False),
    )


def test_json_fail_entry_is_an_enumeration_error(tmp_path: Path) -> None:
    third = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    spec = write_json(
        tmp_path, [gpu_entry(UUID_A), gpu_entry(UUID_B, fail="Unknown Error"), gpu_entry(third)]
    )
    backend = FakeBackend.from_spec(spec)
    inventory = backend.inventory()
    assert [(gpu.index, gpu.uuid) for gpu in inventory.gpus] == [(0, UUID_A), (2, third)]
    assert inventory.errors == (EnumerationError(1, "Unknown Error"),)
    assert backend.watch((UUID_A, UUID_B)) == {UUID_B: "no such GPU"}
    assert not backend.probe(UUID_B)


def test_json_empty_list_is_a_node_without_gpus(tmp_path: Path) -> None:
    assert FakeBackend.from_spec(write_json(tmp_path, [])).inventory().gpus == ()


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        pytest.param({"uuid": UUID_A}, "JSON list", id="not-a-list"),
        pytest.param([1], "GPU 0: not a JSON object", id="entry-not-object"),
        pytest.param([{"model": "m", "memory_mib": 1}], "GPU 0: missing field 'uuid'", id="no-uuid"),
        pytest.param([{"uuid": UUID_A, "memory_mib": 1}], "missing field 'model'", id="no-model"),
        pytest.param([{"uuid": UUID_A, "model": "m"}], "missing field 'memory_mib'", id="no-memory"),
        pytest.param([gpu_entry(memory_mib=-1)], "memory_mib -1", id="negative-memory"),
        pytest.param([gpu_entry(memory_mib=0)], "memory_mib 0", id="zero-memory"),
        pytest.param([gpu_entry(memory_mib="80")], "memory_mib '80'", id="string-memory"),
        pytest.param([gpu_entry(memory_mib=True)], "memory_mib True", id="bool-memory"),
        pytest.param([gpu_entry(memory_mib=1.5)], "memory_mib 1.5", id="float-memory"),
        pytest.param([gpu_entry(), gpu_entry()], f"GPU 1: duplicate uuid '{UUID_A}'", id="duplicate-uuid"),
        pytest.param([gpu_entry(uuid="gpu0")], "uuid 'gpu0'", id="uuid-shape"),
        pytest.param([gpu_entry(uuid=7)], "uuid 7", id="uuid-number"),
        pytest.param([gpu_entry(model="")], "model ''", id="empty-model"),
        pytest.param([gpu_entry(numa=-1)], "numa -1", id="negative-numa"),
        pytest.param([gpu_entry(numa="0")], "numa '0'", id="string-numa"),
        pytest.param([gpu_entry(minor=-3)], "minor -3", id="negative-minor"),
        pytest.param([gpu_entry(mig_enabled="yes")], "mig_enabled 'yes'", id="mig-not-bool"),
        pytest.param([gpu_entry(fail="")], "fail ''", id="empty-fail"),
        pytest.param([gpu_entry(memory_mb=5)], "unknown keys ['memory_mb']", id="typo-key"),
        pytest.param([gpu_entry(f"GPU-{n}") for n in range(65)], "65 GPUs listed", id="too-many"),
    ],
)
def test_bad_json_spec(tmp_path: Path, document: Any, problem: str) -> None:
    spec = write_json(tmp_path, document)
    with pytest.raises(BackendError) as caught:
        FakeBackend.from_spec(spec)
    assert f"fake GPU spec {spec!r}" in str(caught.value)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param("[{", "invalid JSON", id="truncated"),
        pytest.param("", "invalid JSON", id="empty-file"),
        pytest.param(b"\xff\xfe\xfa", "invalid JSON", id="not-text"),
        pytest.param("[" * 100_000, "invalid JSON", id="nested-too-deep"),
    ],
)
def test_unparsable_json_file(tmp_path: Path, content: str | bytes, problem: str) -> None:
    path = tmp_path / "gpus.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(BackendError, match=problem):
        FakeBackend.from_spec(str(path))


def test_unreadable_spec_path(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"nor a readable JSON file: .*Is a directory"):
        FakeBackend.from_spec(str(tmp_path))  # a directory


# --- in-process injection --------------------------------------------------------------------


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend.from_spec("2x1000")


def test_injected_xid_with_and_without_uuid(backend: FakeBackend) -> None:
    uuid = fake_uuid(1)
    backend.inject_xid(uuid, 79)
    backend.inject_xid(None, 48)
    assert backend.wait_event(1) == XidEvent(uuid, 79)
    assert backend.wait_event(1) == XidEvent(None, 48)
    assert backend.wait_event(0) is None


def test_wait_error_is_raised_once(backend: FakeBackend) -> None:
    backend.inject_wait_error("GPU is lost")
    with pytest.raises(WaitError, match="GPU is lost"):
        backend.wait_event(1)
    assert backend.wait_event(0.01) is None


def test_events_and_wait_errors_keep_their_order(backend: FakeBackend) -> None:
    backend.inject_xid(fake_uuid(0), 31)
    backend.inject_wait_error("boom")
    backend.inject_xid(fake_uuid(0), 79)
    assert backend.wait_event(1) == XidEvent(fake_uuid(0), 31)
    with pytest.raises(WaitError):
        backend.wait_event(1)
    assert backend.wait_event(1) == XidEvent(fake_uuid(0), 79)


def test_lost_and_restored(backend: FakeBackend) -> None:
    uuid = fake_uuid(0)
    assert backend.probe(uuid)
    backend.set_lost(uuid, True)
    assert not backend.probe(uuid)
    assert backend.probe(fake_uuid(1))
    inventory = backend.inventory()
    assert [gpu.index for gpu in inventory.gpus] == [1]
    assert inventory.errors == (EnumerationError(0, "GPU is lost"),)
    assert backend.watch((uuid,)) == {uuid: "GPU is lost"}
    backend.set_lost(uuid, False)
    assert backend.probe(uuid)
    assert len(backend.inventory().gpus) == 2


def test_set_lost_on_unknown_gpu_is_refused(backend: FakeBackend) -> None:
    with pytest.raises(ValueError, match="no fake GPU"):
        backend.set_lost(UUID_A, True)


def test_probe_unknown_gpu(backend: FakeBackend) -> None:
    assert not backend.probe(UUID_A)


def test_watch_records_gpus_and_reports_unknown_ones(backend: FakeBackend) -> None:
    assert backend.watch((fake_uuid(0),)) == {}
    assert backend.watch((fake_uuid(1), UUID_A)) == {UUID_A: "no such GPU"}
    assert backend.watched == {fake_uuid(0), fake_uuid(1)}


def test_events_for_unwatched_gpus_are_still_returned(backend: FakeBackend) -> None:
    backend.watch((fake_uuid(0),))
    backend.inject_xid(fake_uuid(1), 79)
    assert backend.wait_event(1) == XidEvent(fake_uuid(1), 79)


@pytest.mark.parametrize("timeout_s", [0.0, 0.05])
def test_wait_times_out(backend: FakeBackend, timeout_s: float) -> None:
    assert backend.wait_event(timeout_s) is None


def waiting(backend: FakeBackend) -> tuple[threading.Thread, list[XidEvent | None]]:
    """A thread waiting (an hour at most) for the backend's next event, and what it got."""
    got: list[XidEvent | None] = []
    thread = threading.Thread(target=lambda: got.append(backend.wait_event(3600)), daemon=True)
    thread.start()
    return thread, got


def test_injection_from_another_thread_wakes_the_waiter(backend: FakeBackend) -> None:
    waiter, got = waiting(backend)
    try:
        backend.inject_xid(fake_uuid(0), 79)
        assert wait_for(lambda: not waiter.is_alive())  # woken, not at the end of its hour
        assert got == [XidEvent(fake_uuid(0), 79)]
    finally:
        backend.close()


def test_concurrent_injectors_lose_nothing(backend: FakeBackend) -> None:
    per_thread = 200

    def inject(thread: int) -> None:
        for n in range(per_thread):
            backend.inject_xid(fake_uuid(thread % 2), thread * per_thread + n)

    threads = [threading.Thread(target=inject, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    received: list[int] = []
    while len(received) < 4 * per_thread:
        event = backend.wait_event(2)
        assert event is not None, f"only {len(received)} events arrived"
        received.append(event.xid)
    for thread in threads:
        thread.join()
    assert sorted(received) == list(range(4 * per_thread))


def test_close_wakes_the_waiter(backend: FakeBackend) -> None:
    waiter, got = waiting(backend)
    backend.close()
    assert wait_for(lambda: not waiter.is_alive())  # woken, not at the end of its hour
    assert got == [None]


# --- events file -----------------------------------------------------------------------------


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


def append(path: Path, text: str) -> None:
    with path.open("a") as stream:
        stream.write(text)


def test_events_file_may_appear_later(events_file: Path) -> None:
    backend = FakeBackend.from_spec("1x100", events_file)
    assert backend.wait_event(0.06) is None
    append(events_file, json.dumps({"xid": 79, "uuid": fake_uuid(0)}) + "\n")
    assert backend.wait_event(1) == XidEvent(fake_uuid(0), 79)


def test_events_file_lines_in_order(events_file: Path) -> None:
    backend = FakeBackend.from_spec("1x100", events_file)
    append(events_file, '{"xid": 13}\n{"xid": 48, "uuid": null}\n{"wait_error": "GPU is lost"}\n')
    assert backend.wait_event(1) == XidEvent(None, 13)
    assert backend.wait_event(1) == XidEvent(None, 48)
    with pytest.raises(WaitError, match="GPU is lost"):
        backend.wait_event(1)
    assert backend.wait_event(0.06) is None


def test_events_file_partial_line_waits_for_its_end(events_file: Path) -> None:
    backend = FakeBackend.from_spec("1x100", events_file)
    append(events_file, '{"xid": 7')
    assert backend.wait_event(0.12) is None
    append(events_file, f'9, "uuid": "{fake_uuid(0)}"}}\n')
    assert backend.wait_event(1) == XidEvent(fake_uuid(0), 79)
    assert backend.wait_event(0.06) is None


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("not json", id="not-json"),
        pytest.param("[79]", id="not-object"),
        pytest.param('{"xid": "79"}', id="string-xid"),
        pytest.param('{"xid": -1}', id="negative-xid"),
        pytest.param('{"xid": true}', id="bool-xid"),
        pytest.param('{"xid": 79, "uuid": 5}', id="number-uuid"),
        pytest.param('{"xid": 79, "gpu": "x"}', id="extra-key"),
        pytest.param('{"lost": ""}', id="empty-lost"),
        pytest.param('{"lost": "a", "restore": "b"}', id="two-actions"),
        pytest.param('{"reboot": "now"}', id="unknown-action"),
        pytest.param('{"wait_error": 3}', id="wait-error-not-text"),
        pytest.param('{"raise": ""}', id="empty-raise"),
        pytest.param("{}", id="empty-object"),
        pytest.param("[" * 100_000, id="nested-too-deep"),
    ],
)
def test_malformed_line_is_logged_and_skipped(
    events_file: Path, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FakeBackend.from_spec("1x100", events_file)
    append(events_file, line + "\n" + '{"xid": 79}\n')
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.fake"):
        assert backend.wait_event(1) == XidEvent(None, 79)
    skipped = [record for record in caplog.records if record.getMessage() == "fake GPU event line skipped"]
    assert len(skipped) == 1
    assert skipped[0].__dict__["fields"]["line"] == line


def test_events_file_lost_and_restore(events_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend.from_spec("2x100", events_file)
    uuid = fake_uuid(1)
    append(events_file, json.dumps({"lost": uuid}) + "\n" + json.dumps({"lost": UUID_A}) + "\n")
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.fake"):
        assert backend.wait_event(0.06) is None
    assert not backend.probe(uuid)
    assert backend.probe(fake_uuid(0))
    assert any(
        record.getMessage() == "fake GPU event for an unknown GPU skipped" for record in caplog.records
    )
    append(events_file, json.dumps({"restore": uuid}) + "\n")
    assert backend.wait_event(0.06) is None
    assert backend.probe(uuid)


def test_events_file_raise_breaks_every_wait_until_cleared(events_file: Path) -> None:
    """A backend failing in a way it is not meant to (for the health worker's supervision)."""
    backend = FakeBackend.from_spec("1x100", events_file)
    append(events_file, '{"raise": "driver in a bad state"}\n')
    for _ in range(2):
        with pytest.raises(RuntimeError, match="driver in a bad state") as raised:
            backend.wait_event(1)
        assert not isinstance(raised.value, WaitError)
    append(events_file, '{"raise": null}\n{"xid": 79}\n')
    assert backend.wait_event(1) == XidEvent(None, 79)


def test_events_file_written_by_another_thread_line_by_line(events_file: Path) -> None:
    backend = FakeBackend.from_spec("2x100", events_file)
    xids = list(range(40, 60))

    def writer() -> None:
        for xid in xids:
            line = json.dumps({"xid": xid, "uuid": fake_uuid(xid % 2)}) + "\n"
            half = len(line) // 2
            append(events_file, line[:half])  # a reader may see half a line: it must wait for the rest
            append(events_file, line[half:])
            time.sleep(0.005)

    thread = threading.Thread(target=writer)
    thread.start()
    received: list[XidEvent] = []
    while len(received) < len(xids):
        event = backend.wait_event(2)
        assert event is not None
        received.append(event)
    thread.join()
    assert received == [XidEvent(fake_uuid(xid % 2), xid) for xid in xids]


def test_events_file_written_by_another_process(events_file: Path) -> None:
    backend = FakeBackend.from_spec("1x100", events_file)
    code = (
        "import json, sys, time\n"
        "path, uuid = sys.argv[1], sys.argv[2]\n"
        "for xid in (31, 79):\n"
        "    with open(path, 'a') as stream:\n"
        "        stream.write(json.dumps({'xid': xid, 'uuid': uuid}) + '\\n')\n"
        "    time.sleep(0.05)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, str(events_file), fake_uuid(0)])
    try:
        first = backend.wait_event(5)
        second = backend.wait_event(5)
    finally:
        assert writer.wait(timeout=10) == 0
    assert [first, second] == [XidEvent(fake_uuid(0), 31), XidEvent(fake_uuid(0), 79)]


def test_unreadable_events_file_fails_the_wait(tmp_path: Path) -> None:
    backend = FakeBackend.from_spec("1x100", tmp_path)  # a directory cannot be read as a file
    with pytest.raises(WaitError, match="cannot read fake GPU events file"):
        backend.wait_event(0.1)


# --- load_backend ----------------------------------------------------------------------------


def test_load_backend_fake(events_file: Path) -> None:
    backend = load_backend("2x100", events_file)
    assert isinstance(backend, FakeBackend)
    assert len(backend.inventory().gpus) == 2


def test_load_backend_bad_fake_spec() -> None:
    with pytest.raises(BackendError, match="fake GPU spec '0x1'"):
        load_backend("0x1", None)


def test_load_backend_events_file_needs_a_fake_spec(events_file: Path) -> None:
    with pytest.raises(BackendError, match="without a fake GPU spec"):
        load_backend(None, events_file)


def test_load_backend_without_spec_uses_nvml() -> None:
    # Either the machine has a driver (an NvmlBackend) or it does not (a clear BackendError).
    try:
        backend = load_backend(None, None)
    except BackendError as err:
        assert str(err).startswith("NVML init failed: ")
    else:
        assert isinstance(backend, NvmlBackend)
        backend.close()
