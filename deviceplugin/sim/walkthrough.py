"""`deviceplugin simulate`, first stage: the README's two examples played through the fit library.

Each step states what should happen, shows what the library decided, and the command exits 1 if
any decision differs from the documented one. (The emulators and the node daemon join this flow
as they land; the decisions shown here are the ones the scheduler side will take.)
"""

from __future__ import annotations

from typing import Any

from deviceplugin import fit
from deviceplugin.fit import keys

MIB_PER_GPU = 10989


def _pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "demo", "uid": f"uid-{name}", "annotations": {}},
        "spec": {"containers": [{"name": "cuda", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


class Walkthrough:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, what: str, got: object, want: object) -> None:
        ok = got == want
        print(f"  {'ok ' if ok else 'BAD'} {what}: {got}" + ("" if ok else f" (expected {want})"))
        if not ok:
            self.failures.append(what)

    def gpu_sharing(self) -> None:
        print(f"1. GPU sharing: node with 2 x {MIB_PER_GPU} MiB GPUs,")
        print("   two pods each limiting volcano.sh/gpu-memory: 1024")
        total = str(2 * MIB_PER_GPU)
        node = {
            "metadata": {"name": "gpu-node", "annotations": {}},
            "status": {"capacity": {keys.GPU_MEMORY: total, keys.GPU_NUMBER: "2"}},
        }
        booked: list[dict[str, Any]] = []
        for number, name in enumerate(("share-a", "share-b")):
            pod = _pod(name, {keys.GPU_MEMORY: "1024"})
            cards = fit.gpushare_cards(node, booked)
            result = fit.fit_gpushare(cards, pod)
            if not result.ok:
                self.check(f"{name} fits", result.reason, "a fit")
                continue
            pod["metadata"]["annotations"].update(
                fit.gpushare_bind_annotations(result, now_ns=1_700_000_000 + number)
            )
            pod["status"]["phase"] = "Running"
            booked.append(pod)
            chosen = result.devices[0][0]
            self.check(f"{name} -> volcano.sh/gpu-index", pod["metadata"]["annotations"][keys.GPU_INDEX], "0")
            print(f"      GPU {chosen.index}: {chosen.memory} MiB of {cards[0].memory} MiB for {name}")
        left = fit.gpushare_cards(node, booked)[0].free_memory
        self.check("GPU 0 memory left", left, MIB_PER_GPU - 2048)

    def vgpu(self) -> None:
        print("2. vGPU: pod limiting volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 4096;")
        print("   node with 2 x 32768 MiB V100s, GPU 0 already holds an 8192 MiB pod")
        gpus = [
            fit.GpuState(index=i, uuid=f"GPU-demo-{i}", type="NVIDIA-Tesla V100-PCIE-32GB", memory=32768)
            for i in range(2)
        ]
        allocatable = {keys.VGPU_NUMBER: "20", keys.VGPU_MEMORY: "65536", keys.VGPU_CORES: "200"}
        register = {keys.NODE_VGPU_REGISTER: fit.encode_node_register(gpus)}
        node = {
            "metadata": {"name": "vgpu-node", "annotations": register},
            "status": {"allocatable": allocatable},
        }
        tenant = _pod("tenant", {})
        tenant["metadata"]["annotations"][keys.VGPU_IDS_NEW] = "GPU-demo-0,NVIDIA,8192,0:"
        state = fit.vgpu_gpus(node, [tenant])
        pod = _pod("worker", {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "4096"})
        requests = fit.parse_vgpu_requests(pod)
        expected = {"binpack": ("GPU-demo-0", 37.5), "spread": ("GPU-demo-1", 100.0)}
        for policy, (uuid, score) in expected.items():
            result = fit.fit_vgpu(state, requests, pod, policy)
            self.check(
                f"{policy}: chosen GPU", result.devices[0][0].uuid if result.ok else result.reason, uuid
            )
            self.check(f"{policy}: score", result.score, score)
            if policy == "binpack" and result.ok:
                notes = fit.vgpu_bind_annotations(result, "vgpu-node", now_s=1_700_000_000)
                print(
                    f"      binding annotation {keys.DEVICES_TO_ALLOCATE}: {notes[keys.DEVICES_TO_ALLOCATE]}"
                )
        volcano = fit.fit_vgpu(state, requests, pod, "spread", "volcano")
        self.check("spread under compat='volcano' (bug B3: spread never scores)", volcano.score, 0.0)


def main() -> int:
    walk = Walkthrough()
    walk.gpu_sharing()
    walk.vgpu()
    if walk.failures:
        print(f"FAILED: {', '.join(walk.failures)}")
        return 1
    print("all decisions as documented")
    return 0
