"""What a container gets on an `mps` vGPU node (docs/mps.md): its GPU shared through that GPU's MPS
control daemon (`deviceplugin.gpu.mps`), held to its `vgpu-memory` and `vgpu-cores` by MPS.

A CUDA process connects to one control daemon, and each GPU has its own, so a container gets one
GPU. Its limits go twice: as the client's environment (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`,
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), which a process may lower but, by MPS's rule, never raise
above what the control daemon sets; and on the daemon (`ceiling`), which is out of the container's
reach, as the largest limit a live container on the GPU holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.mps import MpsDaemons
from deviceplugin.ledger import Allocation

# MPS's default pipe directory: a process that drops CUDA_MPS_PIPE_DIRECTORY still finds its daemon.
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_SHM = "/dev/shm"  # where the MPS server and its clients share memory


def thread_percentage(cores: int) -> int:
    """`vgpu-cores` as MPS's active thread percentage (1 to 100); 0 (no share of the cores booked,
    as HAMi-core reads it: no limit) is the whole GPU."""
    return cores if 0 < cores <= 100 else 100


def restore(daemons: MpsDaemons, live: Sequence[Allocation]) -> None:
    """Set each GPU's `ceiling` from the ledger's live containers, as a plugin starts
    (`MpsDaemons.restore`: once per GPU in this process)."""
    held = {share.uuid for row in live for share in row.gpus}
    daemons.restore({uuid: ceiling(uuid, 0, 1, live) for uuid in daemons.uuids if uuid in held})


def ceiling(uuid: str, memory_mib: int, percent: int, live: Iterable[Allocation]) -> tuple[int, int]:
    """What the GPU's daemon lets any client have: the most any live container on it holds, this
    one included (a container alone on the GPU, or among equals, is held to exactly its own)."""
    memory, cores = memory_mib, percent
    for row in live:
        for share in row.gpus:
            if share.uuid == uuid:
                memory = max(memory, share.memory)
                cores = max(cores, thread_percentage(share.cores))
    return memory, cores


def response(daemons: MpsDaemons, uuid: str, memory_mib: int, percent: int) -> pb.ContainerAllocateResponse:
    """The container's env and mounts: the GPU by UUID, its limits (device 0: the container sees
    its one GPU), the GPU's pipe directory and the daemon's shared memory."""
    root = daemons.control.root
    answer = pb.ContainerAllocateResponse()
    envs = answer.envs
    envs["NVIDIA_VISIBLE_DEVICES"] = uuid
    envs["CUDA_MPS_PIPE_DIRECTORY"] = CONTAINER_PIPE_DIR
    envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_mib}M"
    answer.mounts.add(container_path=CONTAINER_PIPE_DIR, host_path=str(root.pipe_dir(uuid)))
    answer.mounts.add(container_path=CONTAINER_SHM, host_path=str(root.shm))
    return answer
