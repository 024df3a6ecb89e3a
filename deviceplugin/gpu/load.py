"""Which GPU backend the daemon runs on."""

from __future__ import annotations

from pathlib import Path

from deviceplugin.gpu.base import BackendError, GpuBackend
from deviceplugin.gpu.topology import NamedTopology


def load_backend(
    fake_spec: str | None, events_file: Path | None, fake_topology: NamedTopology | None = None
) -> GpuBackend:
    """Fake GPUs when a spec is given, else NVML. Raises `BackendError` when neither can work."""
    # Only the chosen backend is imported: NVML's bindings (pynvml) and the fake GPUs' spec
    # reader are of no use to each other, and each costs start-up (bench/startup.py).
    if fake_spec is not None:
        from deviceplugin.gpu.fake import FakeBackend  # noqa: PLC0415

        return FakeBackend.from_spec(fake_spec, events_file, fake_topology)
    if events_file is not None:
        raise BackendError(f"fake GPU events file {events_file} given without a fake GPU spec")
    if fake_topology is not None:
        raise BackendError(f"fake GPU topology {fake_topology} given without a fake GPU spec")
    from deviceplugin.gpu.nvml import NvmlBackend  # noqa: PLC0415

    return NvmlBackend()
