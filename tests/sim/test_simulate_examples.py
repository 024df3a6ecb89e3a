"""Every scenario under examples/ through `deviceplugin simulate --output json` (issue 19, done-when):
the YAML examples of Volcano's GPU documentation and of the HAMi vGPU plugin, rewritten as
scenarios, run with ok: true and each container gets what its file's comment says; every variant
under examples/wrong/ is reported as wrong, with the reasons its `# expect:` lines give."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from deviceplugin.fit.mig import geometry_for
from deviceplugin.fit.mig_tables import builtin_geometries
from tests.sim.simulate_run import Run, env, simulate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GOOD = sorted(EXAMPLES.glob("*.yaml"))
WRONG = sorted((EXAMPLES / "wrong").glob("*.yaml"))


def gpus(run: Run, pod: str, container: str) -> list[tuple[str, int]]:
    """(node, index) of each GPU the container's NVIDIA_VISIBLE_DEVICES names."""
    where = {g["uuid"]: (n["name"], g["index"]) for n in run.document["nodes"] for g in n["gpus"]}
    visible = env(run.pod(pod), container).get("NVIDIA_VISIBLE_DEVICES", "")
    return [where[uuid] for uuid in visible.split(",")] if visible else []


def vgpu_limits(run: Run, pod: str, container: str) -> list[str]:
    found = env(run.pod(pod), container)
    return [found[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(len(gpus(run, pod, container)))]


def _sharing(run: Run) -> None:
    for pod in ("gpu-pod1", "gpu-pod2"):
        assert gpus(run, pod, "cuda-container") == [("volcano-worker", 0)]
        found = env(run.pod(pod), "cuda-container")
        assert (found["VOLCANO_GPU_ALLOCATED"], found["VOLCANO_GPU_MEMORY_TOTAL"]) == ("1024", "11178")


def _sharing_job(run: Run) -> None:
    for pod in ("gpu-share-job-worker-0", "gpu-share-job-worker-1"):
        assert gpus(run, pod, "cuda-container") == [("gpu-share-1", 0)]
        found = env(run.pod(pod), "cuda-container")
        assert (found["VOLCANO_GPU_ALLOCATED"], found["VOLCANO_GPU_MEMORY_TOTAL"]) == ("1024", "10989")


def _number(run: Run) -> None:
    assert [node for node, _ in gpus(run, "gpu-pod1", "cuda-container")] == ["gpu-number-1"]
    assert env(run.pod("gpu-pod1"), "cuda-container")["VOLCANO_GPU_ALLOCATED"] == "1"


def _number_job(run: Run) -> None:
    held = [gpus(run, f"gpu-number-job-worker-{i}", "cuda-container") for i in range(2)]
    assert [len(each) for each in held] == [2, 2] and len(set(held[0] + held[1])) == 4
    assert {node for each in held for node, _ in each} == {"gpu-number-1"}
    assert env(run.pod("gpu-number-job-worker-0"), "cuda-container")["VOLCANO_GPU_ALLOCATED"] == "2"


def _distributed_training(run: Run) -> None:
    held = [gpus(run, f"distributed-training-worker-{i}", "trainer") for i in range(4)]
    nvlink_pairs = [[(node, a), (node, a + 1)] for node in ("whole-1", "whole-2") for a in (0, 2)]
    assert sorted(held) == nvlink_pairs  # each worker on one NVLink pair, in index order
    # bound by the whole extender (kube-scheduler's routing by managedResources), not a plain Binding
    assert all(
        "volcano.sh/predicate-time" in run.pod(f"distributed-training-worker-{i}")["annotations"]
        for i in range(4)
    )
    assert env(run.pod("distributed-training-worker-0"), "trainer")["VOLCANO_GPU_ALLOCATED"] == "2"


def _hami_core(run: Run) -> None:
    assert [node for node, _ in gpus(run, "hami-pod", "cuda-container")] == ["gpu-vgpu-1"]
    assert vgpu_limits(run, "hami-pod", "cuda-container") == ["3000m"]
    assert env(run.pod("hami-pod"), "cuda-container")["CUDA_DEVICE_SM_LIMIT"] == "50"
    mounts = run.pod("hami-pod")["containers"][0]["mounts"]
    assert "/usr/local/vgpu/libvgpu.so" in [m["container_path"] for m in mounts]


def _vgpu_job(run: Run) -> None:
    for index in range(3):
        pod = f"vgpu-job-worker-{index}"
        assert vgpu_limits(run, pod, "cuda-container") == ["3000m"]
        assert env(run.pod(pod), "cuda-container")["CUDA_DEVICE_SM_LIMIT"] == "50"


def _training(run: Run) -> None:
    assert gpus(run, "training-job", "trainer") == [("vgpu-4x12g", i) for i in range(4)]
    assert vgpu_limits(run, "training-job", "trainer") == ["12288m"] * 4


def _hami_pod(run: Run) -> None:
    assert len(gpus(run, "gpu-pod1", "cuda-container")) == 2
    assert vgpu_limits(run, "gpu-pod1", "cuda-container") == ["3000m", "3000m"]
    assert env(run.pod("gpu-pod1"), "cuda-container")["CUDA_DEVICE_SM_LIMIT"] == "50"


def _hami_examples(run: Run) -> None:
    assert env(run.pod("share-pod1"), "pod1-ctr")["VOLCANO_GPU_ALLOCATED"] == "1024"
    assert vgpu_limits(run, "test1", "pod1-ctr") == ["1024m"]
    assert env(run.pod("test1"), "pod1-ctr")["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert vgpu_limits(run, "pod1", "pod1-ctr") == ["10240m"]
    assert vgpu_limits(run, "gpu-pod12", "ubuntu-container") == ["2000m", "2000m"]
    assert env(run.pod("gpu-pod12"), "ubuntu-container0") == {}
    assert vgpu_limits(run, "gpu-pod12", "ubuntu-container1") == ["3000m", "3000m"]


def _deployment(run: Run) -> None:
    pods = run.document["pods"]
    assert len(pods) == 10
    assert all(re.fullmatch(r"resnet101-deployment-[b-z2-9]+-[b-z2-9]{5}", p["name"]) for p in pods)
    assert {p["node"] for p in pods} == {"a40-1", "a40-2", "a40-3"}
    assert {limit for p in pods for limit in vgpu_limits(run, p["name"], "resnet101-container")} == {"16384m"}


def _gputype(run: Run) -> None:
    nodes = {pod: run.pod(pod)["node"] for pod in ("wants-a100", "avoids-a100", "wants-t4-or-v100")}
    assert nodes == {"wants-a100": "a100-1", "avoids-a100": "t4-1", "wants-t4-or-v100": "t4-1"}
    assert vgpu_limits(run, "wants-a100", "cuda-container") == ["4096m"]


def _uuid(run: Run) -> None:
    for pod in ("on-gpu-1", "not-gpu-0"):
        assert gpus(run, pod, "cuda-container") == [("gpu-vgpu-1", 1)]


def _same_gpu(first: str, second: str) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        assert gpus(run, first, "cuda-container") == gpus(run, second, "cuda-container")

    return check


def _other_gpus(first: str, second: str) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        assert len(set(gpus(run, first, "cuda-container") + gpus(run, second, "cuda-container"))) == 2

    return check


def _mindspore(run: Run) -> None:
    assert env(run.pod("mindspore-gpu-mpimaster-0"), "mpimaster") == {}
    workers = [gpus(run, f"mindspore-gpu-mpiworker-{i}", "mpiworker") for i in range(2)]
    assert [len(w) for w in workers] == [1, 1] and workers[0] != workers[1]
    assert {node for w in workers for node, _ in w} == {"gpu-number-1"}


def _supernode(run: Run) -> None:
    """Each group of 8 GPUs (4 workers) in one super-node: sn-a-* or sn-b-*, two workers a node."""
    nodes = [run.pod(f"llm-train-worker-{i}")["node"] for i in range(8)]
    assert sorted(nodes[:4]) == ["sn-a-1", "sn-a-1", "sn-a-2", "sn-a-2"], nodes
    assert sorted(nodes[4:]) == ["sn-b-1", "sn-b-1", "sn-b-2", "sn-b-2"], nodes
    allocated = {env(run.pod(f"llm-train-worker-{i}"), "trainer")["VOLCANO_GPU_ALLOCATED"] for i in range(8)}
    assert allocated == {"2"}


def _mig(run: Run) -> None:
    """The guide's 3000 MiB MIG pod gets the smallest slice that holds it: a 1g.5gb instance."""
    (node,) = run.document["nodes"]
    (card,) = node["gpus"]
    pod = run.pod("mig-pod")
    assert pod["annotations"]["volcano.sh/vgpu-ids-new"] == f"{card['uuid']}[group1-0],NVIDIA,3000,0:"
    geometry = geometry_for(f"NVIDIA-{node['gpus'][0]['model']}", builtin_geometries())
    assert geometry is not None
    assert [(i.name, i.memory) for i in geometry.groups[0].instances] == [("1g.5gb", 4864)]
    (container,) = pod["containers"]
    assert list(container["env"]) == ["NVIDIA_VISIBLE_DEVICES"] and container["mounts"] == []
    assert container["env"]["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")


def _topology_4gpu(run: Run) -> None:
    """The 4-GPU pod gets the idle socket (4-7), not the first four idle GPUs (1-4) across sockets."""
    assert gpus(run, "one-gpu", "cuda-container") == [("pcie-8", 0)]
    assert sorted(gpus(run, "four-gpus", "cuda-container")) == [("pcie-8", i) for i in range(4, 8)]
    assert env(run.pod("four-gpus"), "cuda-container")["VOLCANO_GPU_ALLOCATED"] == "4"


def _gpu_aware_fragmentation(run: Run) -> None:
    """gpu-aware keeps the mixed pods on frag-1 (binpack alone spreads them), so frag-2 stays idle
    for the 8-GPU pod."""
    held = {
        pod: sorted(gpus(run, pod, "cuda-container")) for pod in ("one-gpu", "share", "two-gpus", "four-gpus")
    }
    assert held == {
        "one-gpu": [("frag-1", 0)],
        "share": [("frag-1", 1)],
        "two-gpus": [("frag-1", 2), ("frag-1", 3)],
        "four-gpus": [("frag-1", i) for i in range(4, 8)],
    }
    assert sorted(gpus(run, "eight-gpus", "cuda-container")) == [("frag-2", i) for i in range(8)]
    assert vgpu_limits(run, "eight-gpus", "cuda-container") == ["16384m"] * 8
    assert vgpu_limits(run, "share", "cuda-container") == ["4096m"]  # 1024 units of 4 MiB


CHECKS: dict[str, Callable[[Run], None]] = {
    "volcano-gpu-sharing.yaml": _sharing,
    "volcano-gpu-sharing-job.yaml": _sharing_job,
    "volcano-gpu-number.yaml": _number,
    "volcano-gpu-number-job.yaml": _number_job,
    "volcano-distributed-training.yaml": _distributed_training,
    "volcano-vgpu-hami-core.yaml": _hami_core,
    "volcano-vgpu-job.yaml": _vgpu_job,
    "volcano-vgpu-mig.yaml": _mig,
    "volcano-vgpu-training-job.yaml": _training,
    "hami-vgpu-pod.yaml": _hami_pod,
    "hami-examples.yaml": _hami_examples,
    "hami-vgpu-deployment.yaml": _deployment,
    "vgpu-gputype.yaml": _gputype,
    "vgpu-uuid.yaml": _uuid,
    "vgpu-policy-binpack.yaml": _same_gpu("first", "second"),
    "vgpu-policy-spread.yaml": _other_gpus("first", "second"),
    "vgpu-podgroup-spread.yaml": _other_gpus("spread-job-worker-0", "spread-job-worker-1"),
    "volcano-job-mindspore.yaml": _mindspore,
    "supernode-job.yaml": _supernode,
    "topology-4gpu.yaml": _topology_4gpu,
    "gpu-aware-fragmentation.yaml": _gpu_aware_fragmentation,
}


def test_every_example_has_its_check() -> None:
    assert sorted(CHECKS) == [path.name for path in GOOD]


@pytest.mark.parametrize("path", GOOD, ids=[path.stem for path in GOOD])
def test_example_runs_with_the_right_env_in_every_container(path: Path) -> None:
    run = simulate("--scenario", str(path), "--output", "json")
    document = run.document
    problems = [pod["problem"] for pod in document["pods"] if pod["problem"]]
    assert (run.code, document["ok"], problems) == (0, True, []), run.stderr
    assert all(pod["phase"] == "Running" for pod in document["pods"])
    CHECKS[path.name](run)


@pytest.mark.parametrize("path", WRONG, ids=[path.stem for path in WRONG])
def test_wrong_variant_is_reported_as_wrong(path: Path) -> None:
    expected = re.findall(r"^# expect: (.+)$", path.read_text(), re.M)
    assert expected, f"{path.name} says what it expects in '# expect:' lines"
    run = simulate("--scenario", str(path), "--output", "json")
    document = run.document
    assert (run.code, document["ok"], document["error"]) == (1, False, None), run.stderr
    problems = "\n".join(pod["problem"] or "" for pod in document["pods"])
    for text in expected:
        assert text in problems, problems
