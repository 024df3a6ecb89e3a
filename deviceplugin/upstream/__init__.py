"""Configuration written for the upstream plugins this one replaces, read as they wrote it:
volcano-sh/devices' config file (`devices`) and the HAMi vGPU plugin's ConfigMaps (`hami`). Each
reader maps what it reads onto the daemon's own option names; `deviceplugin.config` ranks them."""
