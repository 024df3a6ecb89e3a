"""Errors raised on malformed input. All are ValueError subclasses so callers can catch broadly."""

from __future__ import annotations


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


class PodFormatError(FitInputError):
    """A pod or node object is not shaped like Kubernetes JSON."""
