"""`deviceplugin simulate` as a user runs it: the demo, a user's scenario, the JSON document, the
containers' GPUs checked against the scheduler's choice, Volcano Jobs and gangs, shaped clusters,
and scenarios it refuses (issue 19 items 2-4)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.sim.simulate_run import env, simulate, simulate_json

REPO = Path(__file__).resolve().parents[2]
POD_KEYS = {"namespace", "name", "node", "phase", "problem", "annotations", "containers"}


def test_the_demo_prints_every_pod_and_the_env_its_container_sees() -> None:
    done = simulate()
    assert done.code == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.rstrip().splitlines()[-1].startswith("every step behaved as documented")
    assert "BAD" not in out
    workers = [f"demo/job-worker-{n}" for n in range(3)]
    for pod in ("demo/share-a", "demo/share-b", "demo/whole-pair", *workers):
        assert re.search(rf"^{pod} +cuda +gpu-\w+-1 +[0-9,]+ +Running ", out, flags=re.M), out
    assert out.count("VOLCANO_GPU_ALLOCATED=1024") == 2
    assert out.count("CUDA_DEVICE_MEMORY_LIMIT_0=1024m") == 3
    assert re.search(r"^demo/whole-pair +cuda +gpu-number-1 +\d,\d ", out, flags=re.M), out
    # nvidia.com/gpu on the whole node: an NVLink pair, by UUID, with number mode's envs.
    pair = r"^demo/nvidia-pair +cuda +gpu-whole-1 +(0,1|2,3) +Running +"
    pair += r"NVIDIA_VISIBLE_DEVICES=GPU-\S+,GPU-\S+ VOLCANO_GPU_ALLOCATED=2 "
    assert re.search(pair, out, flags=re.M), out
    assert 'volcano_vgpu_device_allocated_memory{NodeName="gpu-vgpu-1"' in out
    assert "state/ledger.db" in out
    # The MIG node's pod sees its MIG device and nothing of HAMi-core.
    mig = r"^demo/mig-worker +cuda +gpu-mig-1 +MIG-\S+ +Running +NVIDIA_VISIBLE_DEVICES=MIG-[-0-9a-f]+ *$"
    assert re.search(mig, out, flags=re.M), out
    # The MPS node's pod: its A10 by UUID, MPS's limits from its request, the GPU's pipe and shm.
    mps = (
        r"^demo/mps-worker +cuda +gpu-mps-1 +0 +Running +NVIDIA_VISIBLE_DEVICES=(GPU-[-0-9a-f]+) "
        r"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 "
        r"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M *$"
    )
    found = re.search(mps, out, flags=re.M)
    assert found, out
    pipe = rf"^  demo/mps-worker cuda mounts /tmp/nvidia-mps <- /\S+/{found[1]}/pipe \(rw\)$"
    assert re.search(pipe, out, flags=re.M), out
    assert re.search(r"^  demo/mps-worker cuda mounts /dev/shm <- /\S+/shm \(rw\)$", out, flags=re.M), out


SMALL_AND_HUGE = """
apiVersion: v1
kind: Pod
metadata: {name: small, namespace: team-a}
spec:
  containers:
  - name: main
    image: cuda
    resources: {limits: {volcano.sh/gpu-memory: "2048"}}
---
apiVersion: v1
kind: Pod
metadata: {name: huge}
spec:
  containers:
  - name: main
    image: cuda
    resources: {limits: {volcano.sh/gpu-memory: "11000"}}
"""


def test_a_users_scenario_in_text(tmp_path: Path) -> None:
    scenario = tmp_path / "pods.yaml"
    scenario.write_text(SMALL_AND_HUGE)
    done = simulate("--scenario", str(scenario))
    out = done.stdout
    assert done.code == 1, out + done.stderr  # "huge" fits no GPU (10989 MiB each), though the node has 2
    small = r"^team-a/small +main +gpu-share-1 +[01] +Running +NVIDIA_VISIBLE_DEVICES=GPU-\S+ "
    small += "VOLCANO_GPU_ALLOCATED=2048"
    assert re.search(small, out, re.M), out
    assert re.search(r"^default/huge +main +- +- +Pending *$", out, re.M), out
    why = "gpu-share-1: pod default/huge needs 11000 MiB of GPU memory on one GPU; none has it"
    assert (
        f"  BAD: default/huge: unschedulable: gpu-number-1: Insufficient volcano.sh/gpu-memory; {why}" in out
    )
    assert out.rstrip().splitlines()[-1].startswith("1 problem(s)")


def test_json_is_one_document_with_the_documented_keys(tmp_path: Path) -> None:
    done = simulate_json(None, tmp_path)
    assert done.code == 0, done.stderr
    document = done.document  # stdout holds nothing else
    assert set(document) == {"ok", "error", "pods", "nodes", "gangs", "not_simulated"}
    assert document["ok"] is True and document["error"] is None
    for pod in document["pods"]:
        assert set(pod) == POD_KEYS
        # Ascend pods stay bound and Pending: HAMi's Ascend plugin, which would run them, is not emulated.
        ascend = pod["node"] == "npu-ascend-1"
        assert pod["phase"] == ("Pending" if ascend else "Running") and pod["problem"] is None
        for container in pod["containers"]:
            assert set(container) == {"name", "env", "mounts"}
            for mount in container["mounts"]:
                assert set(mount) == {"container_path", "host_path", "read_only"}
    for node in document["nodes"]:
        extra = {"annotations", "allocatable"} if node["strategy"] == "ascend" else set()
        assert set(node) == {"name", "strategy", "mode", "memory_factor", "gpus", *extra}
        for gpu in node["gpus"]:
            assert set(gpu) == {"index", "uuid", "model", "memory"}
    # What each container received, against the GPUs of its node.
    share = [env(done.pod(name, "demo"), "cuda") for name in ("share-a", "share-b")]
    assert [e["NVIDIA_VISIBLE_DEVICES"] for e in share] == [done.uuid("gpu-share-1", 0)] * 2
    assert [e["VOLCANO_GPU_ALLOCATED"] for e in share] == ["1024", "1024"]
    pair = env(done.pod("whole-pair", "demo"), "cuda")["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert pair == [done.uuid("gpu-number-1", 0), done.uuid("gpu-number-1", 1)]
    worker = done.pod("job-worker-0", "demo")
    assert env(worker, "cuda")["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    assert "/usr/local/vgpu/libvgpu.so" in [m["container_path"] for m in worker["containers"][0]["mounts"]]
    assert done.node("gpu-vgpu-1")["mode"] == "hami-core" and done.node("gpu-share-1")["mode"] is None
    # The MIG node: its H100 in MIG mode; the pod gets the MIG device of its slot, only that.
    assert done.node("gpu-mig-1")["mode"] == "mig"
    mig_worker = done.pod("mig-worker", "demo")
    assert env(mig_worker, "cuda").keys() == {"NVIDIA_VISIBLE_DEVICES"}
    assert env(mig_worker, "cuda")["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert mig_worker["containers"][0]["mounts"] == []
    # The MPS node: its A10 shared through MPS; the pod's limits are MPS's, its mounts the GPU's
    # pipe directory and the MPS shm, nothing of HAMi-core.
    assert done.node("gpu-mps-1")["mode"] == "mps"
    a10 = done.uuid("gpu-mps-1", 0)
    mps_worker = done.pod("mps-worker", "demo")
    assert mps_worker["node"] == "gpu-mps-1"
    assert env(mps_worker, "cuda") == {
        "NVIDIA_VISIBLE_DEVICES": a10,
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
    }
    pipe, shm = mps_worker["containers"][0]["mounts"]
    assert (pipe["container_path"], pipe["read_only"]) == ("/tmp/nvidia-mps", False)
    assert Path(pipe["host_path"]).parts[-2:] == (a10, "pipe")
    assert (shm["container_path"], shm["read_only"]) == ("/dev/shm", False)
    assert shm["host_path"] == str(Path(pipe["host_path"]).parents[1] / "shm")
    assert mps_worker["annotations"]["volcano.sh/vgpu-ids-new"] == f"{a10},NVIDIA,4096,30:"
    # No other demo pod lands on the MPS node.
    assert [p["name"] for p in done.document["pods"] if p["node"] == "gpu-mps-1"] == ["mps-worker"]


def test_docs_show_the_json_document_with_its_keys(tmp_path: Path) -> None:
    """docs/simulate.md's example document has exactly the keys simulate prints."""
    text = (REPO / "docs" / "simulate.md").read_text()
    example = json.loads(re.search(r"```json\n(.*?)```", text, re.S)[1])  # type: ignore[index]
    assert set(example) == {"ok", "error", "pods", "nodes", "gangs", "not_simulated"}
    assert set(example["pods"][0]) == POD_KEYS
    assert set(example["pods"][0]["containers"][0]) == {"name", "env", "mounts"}
    assert set(example["pods"][0]["containers"][0]["mounts"][0]) == {
        "container_path",
        "host_path",
        "read_only",
    }
    assert set(example["nodes"][0]) == {"name", "strategy", "mode", "memory_factor", "gpus"}
    assert set(example["nodes"][0]["gpus"][0]) == {"index", "uuid", "model", "memory"}
    assert set(example["gangs"][0]) == {"namespace", "name", "source", "min_member", "pods", "scheduled"}


def test_every_fake_node_has_gpus_of_its_own(tmp_path: Path) -> None:
    done = simulate_json(None, tmp_path)
    uuids = [gpu["uuid"] for node in done.document["nodes"] for gpu in node["gpus"]]
    # the MIG node's H100, the MPS node's A10 and the whole node's four too
    assert len(uuids) == 14 and len(set(uuids)) == 14


NUMBER_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: gpu-pod1}}
spec:
  {placement}
  containers:
  - name: cuda-container
    image: nvidia/cuda:9.0-devel
    resources: {{limits: {{volcano.sh/gpu-number: 1}}}}
"""


def test_a_gpu_number_pod_on_a_share_node_never_passes(tmp_path: Path) -> None:
    """The finding: placed on the share node (which also publishes volcano.sh/gpu-number), it got
    no GPU and simulate printed it as fine. Whoever refuses it now (the extender's strategy filter,
    or the check of what the container got), the run fails and says why."""
    done = simulate_json(
        NUMBER_POD.format(placement="nodeSelector: {kubernetes.io/hostname: gpu-share-1}"), tmp_path
    )
    assert done.code == 1, done.stdout + done.stderr
    pod = done.pod("gpu-pod1")
    assert done.document["ok"] is False
    assert "NVIDIA_VISIBLE_DEVICES" not in env(pod, "cuda-container")
    assert pod["problem"].startswith("default/gpu-pod1")


def test_a_container_that_got_no_gpu_fails_the_run_naming_it(tmp_path: Path) -> None:
    """Bound to the share node by hand, nothing schedules it: kubelet admits it with no plugin for
    volcano.sh/gpu-number there, and the container runs without a GPU."""
    done = simulate_json(NUMBER_POD.format(placement="nodeName: gpu-share-1"), tmp_path)
    assert done.code == 1, done.stdout + done.stderr
    pod = done.pod("gpu-pod1")
    assert (pod["node"], pod["phase"]) == ("gpu-share-1", "Running")
    assert pod["problem"] == (
        "default/gpu-pod1 container cuda-container: asks volcano.sh/gpu-number=1 but got no GPU "
        "(no NVIDIA_VISIBLE_DEVICES): kubelet allocated no volcano.sh/gpu-number, no plugin on share "
        "node gpu-share-1 serves it"
    )


WORKLOADS = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  minAvailable: 3
  schedulerName: volcano
  queue: research
  plugins: {ssh: [], svc: []}
  policies: [{event: PodEvicted, action: RestartJob}]
  tasks:
  - name: master
    replicas: 1
    template:
      spec:
        containers: [{name: main, image: busybox}]
  - name: worker
    replicas: 2
    policies: [{event: TaskCompleted, action: CompleteJob}]
    template:
      metadata: {annotations: {volcano.sh/vgpu-mode: hami-core}}
      spec:
        containers:
        - name: cuda
          image: nvidia/cuda
          resources:
            limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 2048, volcano.sh/vgpu-cores: 30}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: serve, image: cuda, resources: {limits: {volcano.sh/gpu-memory: 2048}}}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: batch}
spec:
  replicas: 1
  selector: {matchLabels: {app: batch}}
  template:
    metadata: {labels: {app: batch}}
    spec:
      containers:
      - {name: run, image: cuda, resources: {limits: {volcano.sh/gpu-number: 1}}}
      nodeName: gpu-number-1
"""


def test_volcano_jobs_deployments_and_replicasets_become_the_pods_their_controllers_make(
    tmp_path: Path,
) -> None:
    done = simulate_json(WORKLOADS, tmp_path)
    document = done.document
    assert done.code == 0 and document["ok"] is True, done.stdout + done.stderr
    (gang,) = document["gangs"]
    assert gang["source"] == "Job ml/train" and gang["min_member"] == 3 and gang["scheduled"] is True
    assert gang["pods"] == ["train-master-0", "train-worker-0", "train-worker-1"]
    assert re.fullmatch(r"train-[0-9a-f-]{36}", gang["name"])
    for name, task, index in (("train-master-0", "master", "0"), ("train-worker-1", "worker", "1")):
        notes = done.pod(name, "ml")["annotations"]
        assert notes["volcano.sh/job-name"] == "train"
        assert notes["volcano.sh/task-spec"] == task and notes["volcano.sh/task-index"] == index
        assert notes["scheduling.k8s.io/group-name"] == gang["name"]
        assert notes["volcano.sh/queue-name"] == "research"
    assert done.pod("train-master-0", "ml")["containers"][0]["env"] == {}  # asks for no GPU: none given
    worker = env(done.pod("train-worker-0", "ml"), "cuda")
    assert worker["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m" and worker["CUDA_DEVICE_SM_LIMIT"] == "30"
    web = [p for p in document["pods"] if p["name"].startswith("web-")]
    assert len(web) == 2 and all(re.fullmatch(r"web-[b-z2-9]{3,10}-[b-z2-9]{5}", p["name"]) for p in web)
    assert {env(p, "serve")["VOLCANO_GPU_ALLOCATED"] for p in web} == {"2048"}
    (batch,) = [p for p in document["pods"] if p["name"].startswith("batch-")]
    assert re.fullmatch(r"batch-[b-z2-9]{5}", batch["name"]) and batch["node"] == "gpu-number-1"
    assert document["not_simulated"] == [
        "Job ml/train: spec.queue",
        "Job ml/train: spec.plugins",
        "Job ml/train: spec.policies",
        "Job ml/train: spec.tasks[1].policies",
    ]


GANGS = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: too-big}
spec:
  minAvailable: 3
  tasks:
  - name: worker
    replicas: 3
    template:
      spec:
        containers:
        - name: cuda
          image: cuda
          resources: {limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 12000}}
---
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: partial}
spec:
  minAvailable: 2
  tasks:
  - name: worker
    replicas: 3
    template:
      spec:
        containers:
        - name: cuda
          image: cuda
          resources: {limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 12000}}
"""


def test_a_gang_is_bound_whole_or_not_at_all(tmp_path: Path) -> None:
    """On one vGPU node of 2 x 16384 MiB: three 12000 MiB workers cannot all fit, so none of
    `too-big` is bound (minAvailable 3); `partial` needs two: two are bound, the third waits."""
    done = simulate_json(GANGS, tmp_path, "--nodes", "strategy=vgpu")
    assert done.code == 1, done.stdout + done.stderr
    too_big, partial = done.document["gangs"]
    assert (too_big["scheduled"], partial["scheduled"]) == (False, True)
    for index in range(3):
        pod = done.pod(f"too-big-worker-{index}")
        assert (pod["node"], pod["phase"]) == (None, "Pending")
        assert pod["problem"].startswith(f"default/too-big-worker-{index}: gang not scheduled: pod group ")
        assert (
            "(Job default/too-big, minMember 3): 2 of 3 pods can be placed, so none is bound"
            in pod["problem"]
        )
        assert (
            "too-big-worker-2 (volcano.sh/vgpu-memory=12000, volcano.sh/vgpu-number=1) found no node"
            in (pod["problem"])
        )
    placed = [done.pod(f"partial-worker-{index}") for index in range(3)]
    assert [p["node"] for p in placed] == ["gpu-vgpu-1", "gpu-vgpu-1", None]
    assert placed[2]["problem"].startswith("default/partial-worker-2: unschedulable: gpu-vgpu-1:")


def test_shaped_nodes_models_memory_factor_and_gpu_types(tmp_path: Path) -> None:
    """--nodes with models, memory, counts and a memory factor; nvidia.com/use-gputype and
    nouse-gputype pick the node by model; memory requests count the node's units."""
    pods = """
apiVersion: v1
kind: Pod
metadata: {name: wants-a100, annotations: {nvidia.com/use-gputype: A100}}
spec:
  containers:
  - {name: c, image: cuda, resources: {limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 1000}}}
---
apiVersion: v1
kind: Pod
metadata: {name: not-a100, annotations: {nvidia.com/nouse-gputype: A100}}
spec:
  containers:
  - {name: c, image: cuda, resources: {limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 1000}}}
"""
    done = simulate_json(
        pods,
        tmp_path,
        "--nodes",
        "name=t4,strategy=vgpu,model=Tesla T4,memory=15360,count=1",
        "--nodes",
        "name=a100,strategy=vgpu,model=NVIDIA A100-PCIE-40GB,memory=40960,count=4,memory-factor=4",
    )
    assert done.code == 0, done.stdout + done.stderr
    nodes = done.document["nodes"]
    assert [(n["name"], n["strategy"], n["memory_factor"], len(n["gpus"])) for n in nodes] == [
        ("t4", "vgpu", 1, 1),
        ("a100", "vgpu", 4, 4),
    ]
    assert done.node("a100")["gpus"][3] | {"uuid": ""} == {
        "index": 3,
        "uuid": "",
        "model": "NVIDIA A100-PCIE-40GB",
        "memory": 40960,
    }
    assert (done.pod("wants-a100")["node"], done.pod("not-a100")["node"]) == ("a100", "t4")
    a100 = env(done.pod("wants-a100"), "c")
    assert a100["NVIDIA_VISIBLE_DEVICES"] == done.uuid("a100", 0)
    assert a100["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"  # 1000 units of 4 MiB
    assert env(done.pod("not-a100"), "c")["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


REFUSED = [
    (
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
        "document 1: apiVersion 'v1' kind 'Service' is not simulated",
    ),
    (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  minAvailable: 3\n"
        "  tasks: [{name: w, replicas: 2, template: {spec: {containers: [{name: c, image: i}]}}}]\n",
        "document 1.spec.minAvailable: job 'minAvailable' should not be greater than total replicas "
        "in tasks (3 > 2)",
    ),
    (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  minAvaliable: 1\n"
        "  tasks: [{name: w, replicas: 1, template: {spec: {containers: [{name: c, image: i}]}}}]\n",
        "document 1.spec: unknown field(s) minAvaliable",
    ),
    ("nodes: [{strategy: mig}]\n", "document 1: nodes[0].strategy: 'mig' must be one of share, number, vgpu"),
    (
        "nodes: [{strategy: vgpu, mode: exclusive}]\n",
        "nodes[0].mode: 'exclusive' must be one of hami-core, mig, mps",
    ),
    (
        "nodes: [{strategy: vgpu, mode: mig}]\n",
        "nodes[0].model: 'Tesla T4' (16384 MiB) has no MIG profile table; a mig node's model must be one of",
    ),
    (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n",
        "document 1.spec.containers must be",
    ),
    (
        "kind: Pod\nmetadata: [\n",
        "bad.yaml: not YAML: line 3, column 1: expected the node content, but found '<stream end>'",
    ),
]


@pytest.mark.parametrize(("text", "error"), REFUSED, ids=[e.split(":")[0][:40] for _, e in REFUSED])
def test_a_scenario_it_cannot_simulate_is_an_error_on_stderr(tmp_path: Path, text: str, error: str) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(text)
    done = simulate("--scenario", str(scenario))
    assert (done.code, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("deviceplugin simulate: ") and error in line


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("strategy=share,count=0", "--nodes: nodes[0].count: '0' must be a whole number from 1 to 64"),
        (
            "strategy=vgpu,count=8,memory=81920",
            "--nodes: nodes[0]: 8 GPUs of 81920 MiB advertise more memory devices than kubelet takes at "
            "memory-factor 1; give memory-factor: 12 or more",
        ),
        ("strategy=vgpu,colour=red", "--nodes: nodes[0]: unknown key(s) colour"),
        ("strategy=share,name=Bad_Name", "--nodes: nodes[0].name: 'Bad_Name' must be a lowercase DNS label"),
        ("strategy=number,mode=hami-core", "--nodes: nodes[0].mode: only vgpu nodes have a sharing mode"),
        ("/nonexistent.yaml", "--nodes /nonexistent.yaml: neither key=value pairs nor a readable YAML file"),
    ],
)
def test_nodes_it_cannot_simulate_are_an_error_on_stderr(value: str, error: str) -> None:
    done = simulate("--nodes", value)
    assert (done.code, done.stdout) == (2, "")
    assert done.stderr.startswith(f"deviceplugin simulate: {error}"), done.stderr
