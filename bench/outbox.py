"""How fast the outbox empties a backlog, and how many API requests it spends on it.

The backlog an API outage leaves behind a burst of share-mode Allocates (issue 13 measured 8,778
entries): per pod `gpu-assigned` and the release of Volcano's node lock, a tenth of the pods
deleted meanwhile. The ledger is filled before the daemon starts (as a restart finds it); the
daemon runs as a subprocess against the API-server emulator, which runs in a process of its own
at a lower CPU priority (`--api-nice`, as in bench/allocate.py). Timed from the outbox's first
batch to an empty outbox (the daemon's metrics, polled every 20 ms). The old pacing (a batch of
50 entries, then a 1 s wait) set a floor of 50 entries/s.
Run: `.venv/bin/python bench/outbox.py [--entries N] [--api-nice 0]`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path

from common import daemon_command
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin.ledger import Ledger, Patch
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator

NODE = "bench"
OLD_RATE = 50.0  # entries/s: a batch of 50, then the 1 s idle wait
DELETED_EVERY = 10  # one pod in ten is gone by the time the outbox runs


def serve_api(conn: Connection, kubeconfig: Path, pods: int, nice: int) -> None:
    """The API server's process: the node and its pods (some deleted again); then, when asked,
    the PATCH requests it answered, by target."""
    os.nice(nice)
    with ApiServerEmulator() as apiserver:
        apiserver.create("nodes", {"metadata": {"name": NODE}})
        apiserver.create("namespaces", {"metadata": {"name": "bench"}})
        uids = []
        for n in range(pods):
            pod = {
                "metadata": {"name": f"p{n:05d}", "namespace": "bench"},
                "spec": {"nodeName": NODE, "containers": [{"name": "cuda", "image": "cuda"}]},
            }
            uids.append(apiserver.create("pods", pod)["metadata"]["uid"])
        for n in range(0, pods, DELETED_EVERY):
            apiserver.delete("pods", f"p{n:05d}", "bench")
        conn.send((str(apiserver.write_kubeconfig(kubeconfig)), uids))
        conn.recv()
        deleted = {f"/pods/p{n:05d}" for n in range(0, pods, DELETED_EVERY)}
        patches: collections.Counter[str] = collections.Counter()
        for record in apiserver.requests.records():
            if record.method == "PATCH":
                kind = "node" if "/nodes/" in record.path else "pod"
                gone = kind == "pod" and any(record.path.endswith(path) for path in deleted)
                patches[f"{kind} (deleted)" if gone else kind] += 1
        conn.send(patches)
        with contextlib.suppress(EOFError):
            conn.recv()  # serve until the daemon is stopped and the pipe closed


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "outbox" in sample.name
    }


def metrics_url(log: Path) -> str:
    pattern = re.compile(r"metrics listening.*port=(\d+)")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = pattern.findall(log.read_text())
        if found:
            return f"http://127.0.0.1:{found[-1]}"
        time.sleep(0.05)
    raise SystemExit(f"the daemon never listened for metrics:\n{log.read_text()[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=8778, help="backlog size (two entries per pod)")
    parser.add_argument("--api-nice", type=int, default=10, help="CPU niceness of the API emulator")
    args = parser.parse_args()
    pods = args.entries // 2
    work = Path(tempfile.mkdtemp(prefix="dpoutbox", dir="/tmp"))
    spawn = multiprocessing.get_context("spawn")
    conn, child_conn = spawn.Pipe()
    api = spawn.Process(target=serve_api, args=(child_conn, work / "kc", pods, args.api_nice))
    api.start()
    try:
        kubeconfig, uids = conn.recv()
        ledger = Ledger(work / "state" / "ledger.db")
        for n, uid in enumerate(uids):
            assigned = Patch("pod", "bench", f"p{n:05d}", {"volcano.sh/gpu-assigned": "true"}, uid)
            ledger.enqueue([assigned, Patch("node", "", NODE, {"gpu": None})])
        ledger.close()
        log = work / "daemon.log"
        with KubeletEmulator(work / "dp"), log.open("w") as out:
            extra = ["--kubeconfig", kubeconfig, "--pod-resources-socket", str(work / "none.sock")]
            command = daemon_command(work, NODE, "2x81920", extra)
            daemon = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
            try:
                return report(conn, metrics_url(log), len(uids) * 2)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(30)
    finally:
        conn.close()
        api.join(10)
        api.kill()
        shutil.rmtree(work)


def report(api: Connection, url: str, entries: int) -> int:
    backlog = ("volcano_gpu_plugin_outbox_backlog", ())
    deadline = time.monotonic() + 600
    started = None
    while time.monotonic() < deadline:
        sample = scrape(url)
        if started is None and any(name.endswith("batches_total") for name, _ in sample):
            started = time.monotonic()
        if started is not None and sample.get(backlog) == 0:
            break
        time.sleep(0.02)
    else:
        raise SystemExit("the outbox did not empty within 600 s")
    seconds = time.monotonic() - started
    api.send("count")
    patches: collections.Counter[str] = api.recv()
    print(
        f"{entries:,} entries ({entries // 2:,} pods, one in {DELETED_EVERY} deleted; "
        "gpu-assigned and the lock release each)"
    )
    print(
        f"drained in {seconds:.2f} s: {entries / seconds:,.0f} entries/s "
        f"(old pacing: {OLD_RATE:.0f}/s, {entries / OLD_RATE:.0f} s)"
    )
    print(f"PATCH requests: {dict(patches)} (node: the outbox's lock release and the node publisher's)")
    for (name, labels), value in sorted(sample.items()):
        if (name, labels) != backlog:
            print(f"  {name}{dict(labels) or ''}: {value:.0f}")
    ok = entries / seconds > OLD_RATE and patches["pod (deleted)"] == 0
    print(f"{'beats' if ok else 'DOES NOT beat'} the old floor, with no request for a deleted pod")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
