"""What `volcano_gpu_plugin_api_errors_total` counts, end to end: the daemon as a subprocess, a pod
admitted by the kubelet emulator, the API-server emulator answering."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import NODE, Daemon, eventually
from tests.e2e import test_allocate as alloc
from tests.e2e.test_outbox import backlog, metric
from tests.e2e.test_vgpu import samples


def node_patch_answers(apiserver: ApiServerEmulator) -> list[int]:
    """The status codes of the PATCHes of the daemon's Node object (not its status)."""
    records = apiserver.requests.records()
    return [r.code for r in records if r.method == "PATCH" and r.path.endswith(f"/nodes/{NODE}")]


def test_removing_a_node_lock_that_is_already_gone_is_not_an_api_error(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Issue 19: with the extender (or a Volcano that took no lock) the node has no `gpu` lock; the
    daemon's removal is answered 422 and nothing is written, which is what it wanted. That answer
    was counted in api_errors_total{call="patch_node",status="422"}, an alert on the metric firing
    for every pod served."""
    share = alloc.launch(start, apiserver, kubelet, workdir)
    pod = alloc.make_pod(apiserver, "solo", 1024)
    alloc.admit(kubelet, pod, share)
    eventually(lambda: alloc.assigned(apiserver, "solo") and backlog(share) == 0, share)
    assert 422 in node_patch_answers(apiserver)  # it did ask, and the lock was already gone
    assert samples(share, "volcano_gpu_plugin_api_errors_total") == {}
    assert metric(share, "outbox_entries_total", outcome="sent") == 2  # the pod's patch and the removal
