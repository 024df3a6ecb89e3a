"""Annotations a scheduler writes on the Binding once a fit is chosen (Volcano's Allocate output)."""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.fit import keys
from deviceplugin.fit.codec import encode_pod_devices, encode_pod_devices_volcano, format_gpu_index
from deviceplugin.fit.model import Compat, FitResult, is_volcano_compat


def gpushare_bind_annotations(result: FitResult, now_ns: int) -> dict[str, str]:
    """`gpu-index` (chosen cards, in choice order) and `predicate-time` (Unix nanoseconds).

    The device plugin serves pending pods in predicate-time order, so the time must come from
    the moment of the decision. A result without devices (a pod with no gpushare request) has
    nothing to bind and raises `GpuIndexError`.
    """
    indices = [device.index for devices in result.devices for device in devices if device.index is not None]
    return {keys.GPU_INDEX: format_gpu_index(indices), keys.PREDICATE_TIME: str(now_ns)}


def vgpu_bind_annotations(
    result: FitResult, node_name: str, now_s: int, compat: Compat = None
) -> dict[str, str]:
    """The six annotations of a vGPU bind; the plugin consumes `devices-to-allocate` per container.

    compat="volcano" writes the devices as Volcano's `encodePodDevices` does, unchecked (a wrapped
    memory request appears as a negative number there)."""
    encode = encode_pod_devices_volcano if is_volcano_compat(compat) else encode_pod_devices
    devices = encode(result.devices)
    return {
        keys.VGPU_NODE: node_name,
        keys.VGPU_TIME: str(now_s),
        keys.VGPU_IDS_NEW: devices,
        keys.DEVICES_TO_ALLOCATE: devices,
        keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
        keys.BIND_TIME: str(now_s),
    }


GPUSHARE_BIND_KEYS = (keys.PREDICATE_TIME, keys.GPU_INDEX)
VGPU_BIND_KEYS = (
    keys.VGPU_NODE,
    keys.VGPU_TIME,
    keys.VGPU_IDS_NEW,
    keys.DEVICES_TO_ALLOCATE,
    keys.BIND_PHASE,
    keys.BIND_TIME,
)


def vgpu_release_keys(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """Annotations to drop when a vGPU binding is undone (Volcano's Release).

    Once the plugin has reported `bind-phase: success` the annotations are the plugin's record of
    a running pod and stay; before that, all six bind annotations go.
    """
    if annotations.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS:
        return ()
    return VGPU_BIND_KEYS
