"""Failures a user meets: unknown node, malformed annotations, API server down, bad kubeconfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deviceplugin.fit import keys
from deviceplugin.inspect import kubectl_main
from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import add_pod, gpu_node, gpushare_pod, load_cluster, load_share, share_node
from tests.inspect.conftest import Inspect
from tests.inspect.table import gpu_row, read_table


def test_unknown_node_is_a_clear_error(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    run = inspect("gpu-nope")
    assert run.code == 1
    assert run.out == ""
    assert "node 'gpu-nope' not found" in run.err
    assert apiserver.url in run.err


def test_malformed_registration_shows_the_node_with_a_problem(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_share(apiserver)
    capacity = {keys.VGPU_NUMBER: "10", keys.VGPU_MEMORY: "16384", keys.VGPU_CORES: "100"}
    bad = "GPU-cccc,10,lots,NVIDIA-T4,true,hami-core:"
    apiserver.create("nodes", gpu_node("gpu-bad-1", "10.0.0.30", capacity, {keys.NODE_VGPU_REGISTER: bad}))
    run = inspect()
    assert run.code == 0, run.err
    broken = [row for row in read_table(run.out) if row["NAME"] == "gpu-bad-1"]
    assert broken == [
        {
            "NAME": "gpu-bad-1",
            "IPADDRESS": "10.0.0.30",
            "STRATEGY": "vgpu",
            "GPU": "-",
            "MODE": "-",
            "MEMORY(MiB)": "-",
            "CORES(%)": "-",
            "PODS": "-",
            "PENDING": "-",
            "HEALTH": "see problems",
        }
    ]
    problems = run.out.split("Problems:")[1]
    assert "gpu-bad-1: volcano.sh/node-vgpu-register" in problems
    assert "memory 'lots' is not a non-negative integer" in problems
    # The healthy node is still fully reported, and the totals are its own.
    assert gpu_row(run.out, "gpu-share-1", "0")["MEMORY(MiB)"] == "6144/16384"
    assert "Allocated/Total GPU Memory In Cluster: 14336/32768 MiB (43%)" in run.out


def test_malformed_unhealthy_ids_keep_the_gpus_with_a_note(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    node = share_node("gpu-odd-1", "10.0.0.31", 2, 8192, {keys.GPU_UNHEALTHY_IDS: "one"})
    apiserver.create("nodes", node)
    add_pod(apiserver, gpushare_pod("p1", "gpu-odd-1", keys.GPU_MEMORY, 1024, "1", True))
    document = json.loads(inspect("-o", "json").out)
    (report,) = document["nodes"]
    assert [gpu["memoryMiB"] for gpu in report["gpus"]] == [
        {"allocated": 0, "total": 8192},
        {"allocated": 1024, "total": 8192},
    ]
    assert len(report["problems"]) == 1
    assert report["problems"][0].startswith("volcano.sh/gpu-unhealthy-ids: ")
    assert "GPU health unknown" in report["problems"][0]


def test_malformed_pod_annotation_is_named_and_skipped(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_share(apiserver)
    add_pod(apiserver, gpushare_pod("weird", "gpu-share-1", keys.GPU_MEMORY, 512, "zero", True))
    run = inspect()
    assert run.code == 0, run.err
    assert gpu_row(run.out, "gpu-share-1", "0")["MEMORY(MiB)"] == "6144/16384"
    problems = run.out.split("Problems:")[1]
    assert "gpu-share-1: pod ml/weird:" in problems
    assert "'zero' is not a GPU index" in problems


def test_unreadable_memory_factor_is_noted(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    apiserver.create("nodes", share_node("gpu-f", "10.0.0.32", 1, 4096, {keys.GPU_MEMORY_FACTOR: "auto"}))
    (node,) = json.loads(inspect("-o", "json").out)["nodes"]
    assert node["gpus"][0]["memoryMiB"] == {"allocated": 0, "total": 4096}
    assert node["problems"] == [
        f"annotation {keys.GPU_MEMORY_FACTOR} 'auto' is not a positive whole number; 1 MiB per unit assumed"
    ]


def test_memory_factor_of_4301_digits_is_noted(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    """The factor is read as the extender reads it, digits bounded: kubectl-gpushare read it with
    int() and died of Python's 4300-digit limit (a ValueError) on such a node."""
    factor = "9" * 4301
    apiserver.create("nodes", share_node("gpu-f", "10.0.0.32", 1, 4096, {keys.GPU_MEMORY_FACTOR: factor}))
    run = inspect("-o", "json")
    assert run.code == 0, run.err
    (node,) = json.loads(run.out)["nodes"]
    assert node["gpus"][0]["memoryMiB"] == {"allocated": 0, "total": 4096}
    assert node["problems"] == [
        f"annotation {keys.GPU_MEMORY_FACTOR} has 4301 digits; a memory factor has at most 19; "
        "1 MiB per unit assumed"
    ]


def test_api_server_down_exits_1_naming_the_server(
    apiserver: ApiServerEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = apiserver.url
    apiserver.stop()
    code = kubectl_main(["--kubeconfig", str(kubeconfig)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"kubectl gpushare: cannot reach the Kubernetes API server at {url}")


def test_missing_kubeconfig_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = kubectl_main(["--kubeconfig", str(tmp_path / "absent")])
    assert code == 2
    assert f"kubeconfig {tmp_path / 'absent'} does not exist" in capsys.readouterr().err


def test_unusable_kubeconfig_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    assert kubectl_main(["--kubeconfig", str(config)]) == 2
    assert "cannot use the kubeconfig" in capsys.readouterr().err


def test_kubeconfig_from_environment(
    apiserver: ApiServerEmulator,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    load_share(apiserver)
    monkeypatch.setenv("KUBECONFIG", f"{kubeconfig.parent / 'absent'}:{kubeconfig}")
    assert kubectl_main([]) == 0
    assert gpu_row(capsys.readouterr().out, "gpu-share-1", "1")["MEMORY(MiB)"] == "8192/16384"


def test_no_kubeconfig_anywhere_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kubectl_main([]) == 2
    assert "no kubeconfig: pass --kubeconfig, set KUBECONFIG" in capsys.readouterr().err


def test_bad_output_format_exits_2(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        kubectl_main(["-o", "yaml", "--kubeconfig", str(kubeconfig)])
    assert exited.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err
