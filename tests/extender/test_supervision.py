"""The extender's caches are supervised workers (issue 13, item 2): the API server answers a list or
watch with something the client cannot read (a broken proxy's HTML page), the cache's worker
crashes on it, again on every restart while it lasts, and `/readyz` says which worker and why; once
the answers are readable again it lists afresh, what changed meanwhile is counted, and it is ready."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Running,
    StartExtender,
    create_pod,
    eventually,
    memory_pod,
    share_node,
)


def restarts(running: Running) -> dict[str, float]:
    """`volcano_gpu_extender_worker_restarts_total` by worker, from `/metrics`."""
    with urllib.request.urlopen(running.extender.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.labels["worker"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "volcano_gpu_extender_worker_restarts_total"
    }


def crash_loop(
    apiserver: ApiServerEmulator,
    running: Running,
    worker: str,
    caplog: pytest.LogCaptureFixture,
    meanwhile: Callable[[], object],
) -> None:
    """Garble every list and watch of the worker's kind until `/readyz` names it as restarting in
    a loop; do `meanwhile` (its cache sees nothing of it then); answer properly again and wait for
    ready."""
    kind = worker.removesuffix("-cache")
    assert restarts(running) == {"node-cache": 0, "pod-cache": 0}
    garbled = apiserver.faults.garble(method="GET", path=f"/api/v1/{kind}s")
    apiserver.drop_watches()  # the next watch request meets the fault
    client = running.client

    def looping() -> bool:
        reply = client.request("GET", "/readyz")
        return reply.status == 503 and f"worker {worker} is restarting in a loop" in reply.body

    eventually(looping, 20)
    body = client.request("GET", "/readyz").body
    assert "JSONDecodeError" in body and f"{kind} cache not synced with the API server" in body
    assert restarts(running)[worker] >= 3
    crashes = [r for r in caplog.records if r.getMessage() == "worker crashed, restarting"]
    assert crashes and {r.fields["worker"] for r in crashes} == {worker}  # type: ignore[attr-defined]
    assert "JSONDecodeError" in crashes[0].fields["error"]  # type: ignore[attr-defined]
    meanwhile()
    apiserver.faults.clear(garbled)
    eventually(lambda: client.request("GET", "/readyz").status == 200, 40)
    assert client.request("GET", "/readyz").body == "ok"


def test_the_node_cache_recovers_from_a_crash_loop_and_sees_the_node_added_meanwhile(
    apiserver: ApiServerEmulator, start_extender: StartExtender, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.create("nodes", share_node("n1"))
    running = start_extender(strategy="share")
    crash_loop(apiserver, running, "node-cache", caplog, lambda: apiserver.create("nodes", share_node("n2")))
    assert running.client.filter(memory_pod("job", 1000), ["n1", "n2"])["NodeNames"] == ["n1", "n2"]


def test_the_pod_cache_recovers_from_a_crash_loop_and_counts_the_pod_bound_meanwhile(
    apiserver: ApiServerEmulator, start_extender: StartExtender, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=3000))
    running = start_extender(strategy="share")
    bound = memory_pod("bound-meanwhile", 2011, node="n1", annotations={"volcano.sh/gpu-index": "0"})
    crash_loop(apiserver, running, "pod-cache", caplog, lambda: create_pod(apiserver, bound))
    client = running.client
    assert client.filter(memory_pod("probe", 990), ["n1"])["NodeNames"] == []  # 989 MiB left
    assert client.filter(memory_pod("fits", 989), ["n1"])["NodeNames"] == ["n1"]
