"""Errors raised on malformed input. All are ValueError subclasses so callers can catch broadly."""

from __future__ import annotations

from deviceplugin.fit.keys import STRATEGIES


class FitInputError(ValueError):
    """Base class: an input (annotation, quantity, pod request, config) could not be understood."""


class QuantityError(FitInputError):
    """A Kubernetes resource quantity is malformed or unusable for a GPU resource."""


class RequestError(FitInputError):
    """A pod's GPU request is malformed or impossible (names the container and the problem)."""


class AnnotationError(FitInputError):
    """An annotation value does not decode."""


class PodDevicesError(AnnotationError):
    """A pod devices value (`vgpu-ids-new`, `devices-to-allocate`) does not decode."""


class NodeRegisterError(AnnotationError):
    """A node registration value (`node-vgpu-register`) does not decode."""


class GpuIndexError(AnnotationError):
    """A GPU index list (`gpu-index`, `gpu-unhealthy-ids`) does not decode."""


class ConfigError(FitInputError):
    """A fit configuration (policy, compat flag, MIG geometries) is invalid."""


def unknown_strategy(value: str) -> ConfigError:
    """The error for a string that names no GPU strategy: the scheduler's and the node's family
    registries say the same."""
    return ConfigError(f"GPU strategy must be one of {', '.join(STRATEGIES)}, not {value!r}")


class PodFormatError(FitInputError):
    """A pod or node object is not shaped like Kubernetes JSON."""
