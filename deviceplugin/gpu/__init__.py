"""GPU backends: the real driver (NVML) or fake GPUs, behind `deviceplugin.gpu.base.GpuBackend`;
`deviceplugin.gpu.load` picks one. Nothing is imported here: readers of `gpu.exclude` or `gpu.base`
(the daemon's option parsing, `run --help`) do not pay for pynvml."""
