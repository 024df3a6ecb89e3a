"""The installed `kubectl-gpushare` script, on its own and run by the real kubectl as a plugin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import load_cluster
from tests.inspect.table import gpu_row

SCRIPT = Path(sys.executable).parent / "kubectl-gpushare"


def _env(kubeconfig: Path, home: Path) -> dict[str, str]:
    path = f"{SCRIPT.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def script() -> Path:
    if not SCRIPT.exists():
        pytest.skip("kubectl-gpushare is not installed: run `pip install -e .`")
    return SCRIPT


def test_script_reads_kubeconfig_from_environment(
    apiserver: ApiServerEmulator, kubeconfig: Path, script: Path, tmp_path: Path
) -> None:
    load_cluster(apiserver)
    done = _run([str(script), "gpu-share-1"], _env(kubeconfig, tmp_path))
    assert done.returncode == 0, done.stderr
    assert gpu_row(done.stdout, "gpu-share-1", "0")["MEMORY(MiB)"] == "6144/16384"
    assert "Allocated/Total GPU Memory In Cluster: 14336/32768 MiB (43%)" in done.stdout


def test_script_exit_codes(
    apiserver: ApiServerEmulator, kubeconfig: Path, script: Path, tmp_path: Path
) -> None:
    env = _env(kubeconfig, tmp_path)
    unknown = _run([str(script), "ghost"], env)
    assert unknown.returncode == 1
    assert "kubectl gpushare: node 'ghost' not found" in unknown.stderr
    bad = _run([str(script), "--bogus"], env)
    assert bad.returncode == 2
    assert "unrecognized arguments: --bogus" in bad.stderr


def test_real_kubectl_runs_the_plugin(
    apiserver: ApiServerEmulator, kubeconfig: Path, script: Path, tmp_path: Path
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH")
    load_cluster(apiserver)
    env = _env(kubeconfig, tmp_path)
    text = _run([kubectl, "gpushare"], env)
    assert text.returncode == 0, text.stderr
    assert gpu_row(text.stdout, "gpu-vgpu-1", "0")["CORES(%)"] == "60/100"
    assert "Allocated/Total GPUs In Cluster: 7/8 (87%)" in text.stdout
    listed = _run([kubectl, "gpushare", "gpu-number-1", "-o", "json"], env)
    assert listed.returncode == 0, listed.stderr
    (node,) = json.loads(listed.stdout)["nodes"]
    assert [len(gpu["pods"]) for gpu in node["gpus"]] == [1, 1, 1, 0]
