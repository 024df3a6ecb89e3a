"""The text report a user reads: per-GPU rows for each strategy, pending pods, totals, `-d`, NODE."""

from __future__ import annotations

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import add_pod, gpushare_pod, load_cluster, share_node
from tests.inspect.conftest import Inspect
from tests.inspect.table import gpu_row, read_table


def test_share_node_rows_count_memory_of_running_pods_only(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_cluster(apiserver)
    run = inspect()
    assert run.code == 0, run.err
    gpu0 = gpu_row(run.out, "gpu-share-1", "0")
    assert gpu0["IPADDRESS"] == "10.0.0.11"
    assert gpu0["STRATEGY"] == "share"
    assert (gpu0["MEMORY(MiB)"], gpu0["PODS"], gpu0["PENDING"]) == ("6144/16384", "2", "1")
    assert gpu0["CORES(%)"] == "-"
    # The Succeeded pod's 1000 MiB is not counted.
    gpu1 = gpu_row(run.out, "gpu-share-1", "1")
    assert (gpu1["MEMORY(MiB)"], gpu1["PODS"], gpu1["PENDING"]) == ("8192/16384", "1", "0")


def test_number_node_rows_show_pods_per_gpu_and_health(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_cluster(apiserver)
    out = inspect().out
    cells = [
        (row["GPU"], row["MEMORY(MiB)"], row["PODS"], row["PENDING"], row["HEALTH"])
        for row in read_table(out)
        if row["NAME"] == "gpu-number-1"
    ]
    assert cells == [
        ("0", "-", "1", "0", "ok"),
        ("1", "-", "1", "0", "ok"),
        ("2", "-", "1", "1", "ok"),
        ("3", "-", "0", "0", "unhealthy"),
    ]
    assert gpu_row(out, "gpu-number-1", "0")["STRATEGY"] == "number"


def test_vgpu_node_rows_show_memory_in_mib_cores_and_sharing(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_cluster(apiserver)
    out = inspect().out
    gpu0 = gpu_row(out, "gpu-vgpu-1", "0")
    assert gpu0["STRATEGY"] == "vgpu"
    # Memory factor 2: 20480 registered units are 40960 MiB; pods' 5120+2048+1024 units are 16384 MiB.
    assert (gpu0["MEMORY(MiB)"], gpu0["CORES(%)"], gpu0["PODS"], gpu0["PENDING"]) == (
        "16384/40960",
        "60/100",
        "3/10",
        "1",
    )
    gpu1 = gpu_row(out, "gpu-vgpu-1", "1")
    assert (gpu1["MEMORY(MiB)"], gpu1["CORES(%)"], gpu1["PODS"]) == ("2048/40960", "10/100", "1/10")


def test_pending_pods_and_cluster_totals(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    out = inspect().out
    pending = out.split("Pending (scheduled, not yet served by the device plugin):")[1].split("---")[0]
    assert [line.split() for line in pending.strip().splitlines()] == [
        ["NODE", "POD", "GPU"],
        ["gpu-number-1", "ml/batch-f", "2"],
        ["gpu-share-1", "ml/train-b", "0"],
        ["gpu-vgpu-1", "ml/vg-h", "0"],
    ]
    # 32768 = share 6144 + 8192, vGPU 16384 + 2048; 114688 = 2 x 16384 + 2 x 40960.
    assert "Allocated/Total GPU Memory In Cluster: 32768/114688 MiB (28%)" in out
    assert "Allocated/Total GPUs In Cluster: 7/8 (87%)" in out


def test_nodes_without_gpus_are_left_out(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    names = {row["NAME"] for row in read_table(inspect().out)}
    assert names == {"gpu-share-1", "gpu-number-1", "gpu-vgpu-1"}


def test_node_argument_limits_report_and_totals(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    run = inspect("gpu-share-1")
    assert run.code == 0, run.err
    assert {row["NAME"] for row in read_table(run.out)} == {"gpu-share-1"}
    assert "ml/vg-h" not in run.out
    assert "Allocated/Total GPU Memory In Cluster: 14336/32768 MiB (43%)" in run.out
    assert "Allocated/Total GPUs In Cluster: 2/2 (100%)" in run.out


def test_details_list_each_pod_on_each_gpu(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    out = inspect("-d").out
    vgpu = out.split("gpu-vgpu-1 (vgpu):")[1].split("\n\n")[0]
    assert "GPU 0 (GPU-aaaa-0001, NVIDIA-A100)" in vgpu
    rows = [line.split() for line in vgpu.splitlines() if "ml/" in line]
    assert rows == [
        ["0", "ml/vg-g", "10240", "30", "assigned"],
        ["0", "ml/vg-h", "4096", "20", "pending"],
        ["0", "ml/vg-i", "2048", "10", "assigned"],
        ["1", "ml/vg-i", "2048", "10", "assigned"],
    ]
    share = out.split("gpu-share-1 (share):")[1].split("\n\n")[0]
    assert [line.split() for line in share.splitlines() if "ml/" in line] == [
        ["0", "ml/train-a", "4096", "-", "assigned"],
        ["0", "ml/train-b", "2048", "-", "pending"],
        ["1", "ml/infer-c", "8192", "-", "assigned"],
    ]
    assert "ml/done-d" not in out


def test_share_memory_factor_scales_mib(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    # 2 GPUs of 1000 units x 8 MiB; a pod asking 250 units holds 2000 MiB.
    apiserver.create("nodes", share_node("gpu-f8", "10.0.0.20", 2, 1000, {keys.GPU_MEMORY_FACTOR: "8"}))
    add_pod(apiserver, gpushare_pod("big", "gpu-f8", keys.GPU_MEMORY, 250, "1", True))
    out = inspect().out
    assert gpu_row(out, "gpu-f8", "0")["MEMORY(MiB)"] == "0/8000"
    assert gpu_row(out, "gpu-f8", "1")["MEMORY(MiB)"] == "2000/8000"


def test_empty_cluster_says_so(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    run = inspect()
    assert run.code == 0
    assert "No GPU nodes found" in run.out
    every = "volcano.sh/gpu-memory, volcano.sh/gpu-number, volcano.sh/vgpu-number, nvidia.com/gpu"
    assert f"GPU resource ({every})" in run.out
