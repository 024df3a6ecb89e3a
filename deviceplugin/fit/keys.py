"""Resource names and annotation keys of the Volcano GPU-sharing protocols.

These strings are the wire contract with the Volcano scheduler and the device plugin; they are
facts, kept in one place so every module spells them the same way.
"""

from __future__ import annotations

from typing import Literal

# The GPU families a node runs (one per node; Volcano forbids mixing them). `whole` is NVIDIA's
# resource, whole GPUs without sharing (docs/whole.md); Volcano has no strategy of that name.
Strategy = Literal["share", "number", "vgpu", "whole"]
STRATEGIES: tuple[Strategy, ...] = ("share", "number", "vgpu", "whole")

# Node label: the strategy the node's device plugin runs (this project's daemon publishes it).
GPU_STRATEGY_LABEL = "volcano.sh/gpu-strategy"

# gpushare (volcano.sh/gpu-memory, volcano.sh/gpu-number)
GPU_MEMORY = "volcano.sh/gpu-memory"
GPU_NUMBER = "volcano.sh/gpu-number"
GPU_INDEX = "volcano.sh/gpu-index"
PREDICATE_TIME = "volcano.sh/predicate-time"
GPU_ASSIGNED = "volcano.sh/gpu-assigned"
GPU_UNHEALTHY_IDS = "volcano.sh/gpu-unhealthy-ids"
GPU_MEMORY_FACTOR = "volcano.sh/gpu-memory-factor"
GPUSHARE_LOCK = "gpu"

# whole GPUs, NVIDIA's k8s-device-plugin resource (placed by gpu-index when the extender binds)
NVIDIA_GPU = "nvidia.com/gpu"

# vGPU (HAMi-core under Volcano)
VGPU_NUMBER = "volcano.sh/vgpu-number"
VGPU_MEMORY = "volcano.sh/vgpu-memory"
VGPU_MEMORY_PERCENTAGE = "volcano.sh/vgpu-memory-percentage"
VGPU_CORES = "volcano.sh/vgpu-cores"
NODE_VGPU_REGISTER = "volcano.sh/node-vgpu-register"
NODE_VGPU_HANDSHAKE = "volcano.sh/node-vgpu-handshake"
VGPU_NODE = "volcano.sh/vgpu-node"
VGPU_TIME = "volcano.sh/vgpu-time"
VGPU_IDS_NEW = "volcano.sh/vgpu-ids-new"
DEVICES_TO_ALLOCATE = "volcano.sh/devices-to-allocate"
BIND_PHASE = "volcano.sh/bind-phase"
BIND_TIME = "volcano.sh/bind-time"
VGPU_MODE = "volcano.sh/vgpu-mode"
VGPU_USE_UUID = "volcano.sh/vgpu-use-gpuuuid"
VGPU_NOUSE_UUID = "volcano.sh/vgpu-nouse-gpuuuid"
VGPU_PODGROUP_POLICY = "volcano.sh/vgpu-podgroup-policy"
USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
VGPU_LOCK = "hamivgpu"

# Pod group membership (Kubernetes scheduler-plugins key first, then Volcano's).
KUBE_GROUP_NAME = "scheduling.k8s.io/group-name"
VOLCANO_GROUP_NAME = "scheduling.volcano.sh/group-name"

# Values
BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"
PODGROUP_POLICY_SPREAD = "spread"
MODE_HAMI_CORE = "hami-core"
MODE_MIG = "mig"
MODE_MPS = "mps"
SHARING_MODES = (MODE_HAMI_CORE, MODE_MIG, MODE_MPS)
REQUEST_TYPE_NVIDIA = "NVIDIA"
