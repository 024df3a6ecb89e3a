"""The HAMi vGPU plugin's ConfigMaps in the shipped manifests: the DaemonSet mounts them under
their upstream names where the config file's commented lines point, and deploy/vgpu-config.yaml
starts the daemon once those lines are uncommented."""

from __future__ import annotations

import re
from pathlib import Path

from deviceplugin.config import load_config
from deviceplugin.fit.mig_tables import builtin_geometries
from deviceplugin.upstream.hami import DEVICE_CONFIG_KEY, DEVICE_CONFIG_MAP, NODE_CONFIG_KEY, NODE_CONFIG_MAP
from tests.deploy.manifests import (
    DAEMONSET,
    VGPU_CONFIG,
    config_file,
    container_env,
    documents,
    find,
    mounts,
    only_container,
    volumes,
)
from tests.test_config import flags

UPSTREAM_OPTION = re.compile(r"^( *)# (vgpu-(?:device|node)-config): (\S+)$", re.M)


def test_the_daemonset_mounts_the_upstream_config_maps_optionally() -> None:
    daemonset = find(documents(DAEMONSET), "DaemonSet", "volcano-gpu-deviceplugin")
    by_name = volumes(daemonset)
    for name in (DEVICE_CONFIG_MAP, NODE_CONFIG_MAP):
        (volume,) = [v for v in by_name.values() if v.get("configMap", {}).get("name") == name]
        assert volume["configMap"]["optional"] is True  # a cluster without them still starts
    assert {doc["metadata"]["name"] for doc in documents(VGPU_CONFIG)} == {DEVICE_CONFIG_MAP, NODE_CONFIG_MAP}


def test_uncommented_the_shipped_config_maps_start_a_vgpu_node(tmp_path: Path) -> None:
    docs = [*documents(DAEMONSET), *documents(VGPU_CONFIG)]
    daemonset = find(docs, "DaemonSet", "volcano-gpu-deviceplugin")
    container = only_container(daemonset)
    env = container_env(container, {"spec.nodeName": "gpu-node-1"})
    _, own = config_file(docs, container, daemonset, env["CONFIG_FILE"])
    paths = {option: path for _, option, path in UPSTREAM_OPTION.findall(own)}
    assert set(paths) == {"vgpu-device-config", "vgpu-node-config"}
    for option, key in (("vgpu-device-config", DEVICE_CONFIG_KEY), ("vgpu-node-config", NODE_CONFIG_KEY)):
        assert paths[option].endswith(f"/{key}")
        assert paths[option].rpartition("/")[0] in mounts(container)
        _, content = config_file(docs, container, daemonset, paths[option])  # the ConfigMap mounted there
        (tmp_path / key).write_text(content)
    enabled = UPSTREAM_OPTION.sub(lambda m: f"{m[1]}{m[2]}: {tmp_path / m[3].rpartition('/')[2]}", own)
    (tmp_path / "config.yaml").write_text(enabled.replace("gpu-strategy: share", "gpu-strategy: vgpu"))
    config = load_config(flags(config=str(tmp_path / "config.yaml")), {"NODE_NAME": "gpu-node-1"})
    assert (config.gpu_strategy, config.vgpu_split_count, config.gpu_memory_factor) == ("vgpu", 10, 1)
    assert (config.vgpu_memory_scaling, config.vgpu_core_scaling, config.vgpu_disable_core_limit) == (
        1,
        1,
        False,
    )
    assert any("nodeconfig[0] applies to node gpu-node-1" in note for note in config.notes)


def test_the_shipped_mig_geometries_are_the_daemons_built_in_ones(tmp_path: Path) -> None:
    """The ConfigMap's knownMigGeometries replace the daemon's built-in groups (and Volcano's
    scheduler reads the same): listing fewer models would fail every MIG node of the others."""
    docs = documents(VGPU_CONFIG)
    (device_map,) = [doc for doc in docs if doc["metadata"]["name"] == DEVICE_CONFIG_MAP]
    path = tmp_path / DEVICE_CONFIG_KEY
    path.write_text(device_map["data"][DEVICE_CONFIG_KEY])
    config = load_config(flags(node_name="gpu-node-1", gpu_strategy="vgpu", vgpu_device_config=str(path)), {})
    assert config.vgpu_mig_geometries == builtin_geometries()
