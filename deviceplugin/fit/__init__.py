"""Shared-fit library: Volcano's GPU device-fit rules as pure functions over plain data.

Inputs are Kubernetes-shaped dicts (pods and nodes as the API serves them, camelCase JSON) and the
dataclasses of `deviceplugin.fit.model`; nothing here imports Kubernetes or gRPC code, so any
scheduler can call it. Every decision function takes `compat=None | "volcano"`: the default fixes
Volcano's known bugs (docs/fit.md lists each difference), `"volcano"` reproduces Volcano exactly.
Malformed input raises a `FitInputError` (a ValueError) that says what is wrong and where.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time each name is imported on first use (`__getattr__` below)
    from deviceplugin.fit.bind import (
        GPUSHARE_BIND_KEYS,
        VGPU_BIND_KEYS,
        gpushare_bind_annotations,
        vgpu_bind_annotations,
        vgpu_release_keys,
    )
    from deviceplugin.fit.codec import (
        decode_mig_id,
        decode_node_register,
        decode_pod_devices,
        encode_mig_id,
        encode_node_register,
        encode_pod_devices,
        format_gpu_index,
        parse_gpu_index,
        parse_unhealthy_ids,
        physical_uuid,
    )
    from deviceplugin.fit.errors import (
        AnnotationError,
        ConfigError,
        FitInputError,
        GpuIndexError,
        NodeRegisterError,
        PodDevicesError,
        PodFormatError,
        QuantityError,
        RequestError,
    )
    from deviceplugin.fit.filters import type_allowed, uuid_allowed
    from deviceplugin.fit.gpushare import fit_gpushare, fit_number, fit_share, pod_gpu_memory, pod_gpu_number
    from deviceplugin.fit.model import (
        Assigned,
        Compat,
        ContainerRequest,
        FitResult,
        GpuState,
        MigGeometry,
        MigGroup,
        MigInstance,
        MigState,
        PodUsage,
        VgpuConfig,
    )
    from deviceplugin.fit.quantity import parse_quantity
    from deviceplugin.fit.strategy import (
        STRATEGY_RESOURCES,
        labelled_strategy,
        node_strategy,
        pod_strategy,
        published_strategy,
    )
    from deviceplugin.fit.usage import (
        add_gpushare_pod,
        add_vgpu_pod,
        gpushare_cards,
        holds_gpus,
        remove_gpushare_pod,
        remove_vgpu_pod,
        vgpu_gpus,
    )
    from deviceplugin.fit.vgpu import fit_vgpu, gpu_score, has_vgpu_request, node_score, parse_vgpu_requests

# Where the names of `__all__` live; a reader of one submodule (`fit.keys`) imports only that.
_SOURCES = (
    "bind",
    "codec",
    "errors",
    "filters",
    "gpushare",
    "model",
    "quantity",
    "strategy",
    "usage",
    "vgpu",
)

__all__ = [
    "GPUSHARE_BIND_KEYS",
    "STRATEGY_RESOURCES",
    "VGPU_BIND_KEYS",
    "AnnotationError",
    "Assigned",
    "Compat",
    "ConfigError",
    "ContainerRequest",
    "FitInputError",
    "FitResult",
    "GpuIndexError",
    "GpuState",
    "MigGeometry",
    "MigGroup",
    "MigInstance",
    "MigState",
    "NodeRegisterError",
    "PodDevicesError",
    "PodFormatError",
    "PodUsage",
    "QuantityError",
    "RequestError",
    "VgpuConfig",
    "add_gpushare_pod",
    "add_vgpu_pod",
    "decode_mig_id",
    "decode_node_register",
    "decode_pod_devices",
    "encode_mig_id",
    "encode_node_register",
    "encode_pod_devices",
    "fit_gpushare",
    "fit_number",
    "fit_share",
    "fit_vgpu",
    "format_gpu_index",
    "gpu_score",
    "gpushare_bind_annotations",
    "gpushare_cards",
    "has_vgpu_request",
    "holds_gpus",
    "labelled_strategy",
    "node_score",
    "node_strategy",
    "parse_gpu_index",
    "parse_quantity",
    "parse_unhealthy_ids",
    "parse_vgpu_requests",
    "physical_uuid",
    "pod_gpu_memory",
    "pod_gpu_number",
    "pod_strategy",
    "published_strategy",
    "remove_gpushare_pod",
    "remove_vgpu_pod",
    "type_allowed",
    "uuid_allowed",
    "vgpu_bind_annotations",
    "vgpu_gpus",
    "vgpu_release_keys",
]


def __getattr__(name: str) -> object:
    if name in __all__:
        for source in _SOURCES:
            module = importlib.import_module(f"{__name__}.{source}")
            if name in vars(module):
                value = vars(module)[name]
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
