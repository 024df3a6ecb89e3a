"""The chart in MPS mode (docs/mps.md): `vgpu.mode: mps` gives the daemon its MPS options (read back
with the daemon's own config code) and what its control daemons need: the MPS root from the host
at the same path, <root>/shm as /dev/shm, the driver's "compute" capability, and, unless a sidecar
runs the control daemons, the host's PID namespace and a privileged container; an optional tmpfs
for the shm, mounted once. The other modes carry none of it; bad MPS values are refused by name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import DEFAULT_MPS_CONTROL, DaemonConfig
from deviceplugin.gpu.mps import MpsRoot
from tests.deploy.manifests import (
    Doc,
    container_env,
    daemon_config,
    find,
    mounts,
    only_container,
    pod_spec,
    volumes,
)
from tests.deploy.test_chart import DAEMON, HELM, NODE, refusal, template
from tests.tools import missing

pytestmark = pytest.mark.skipif(HELM is None, reason=missing("helm"))


def mps(**settings: Any) -> dict[str, Any]:
    return {"strategy": "vgpu", "vgpu": {"mode": "mps", "mps": settings}}


def rendered(values: dict[str, Any], where: Path) -> tuple[Doc, DaemonConfig]:
    docs = template(values, where)
    daemonset = find(docs, "DaemonSet", DAEMON)
    return daemonset, daemon_config(docs, daemonset, where, node=NODE)


def host_path(daemonset: Doc, mount: Doc) -> str:
    source = volumes(daemonset)[mount["name"]].get("hostPath")
    assert source is not None, f"{mount['mountPath']}: {mount['name']} is not a hostPath"
    return str(source["path"])


@pytest.mark.parametrize("root", ["/run/nvidia/mps", "/var/run/gpu-mps"])
@pytest.mark.parametrize("sidecar", [False, True])
def test_mps_values_reach_the_daemon_and_mount_its_root_from_the_host(
    root: str, sidecar: bool, tmp_path: Path
) -> None:
    daemonset, config = rendered(mps(root=root, sidecar=sidecar), tmp_path)
    assert (config.vgpu_mode, config.mps_root, config.mps_sidecar) == ("mps", Path(root), sidecar)
    assert config.mps_control == DEFAULT_MPS_CONTROL
    container = only_container(daemonset)
    by_path = mounts(container)
    # Allocate hands containers host paths under the root: inside the pod they must be the same
    mount = by_path[str(config.mps_root)]
    assert host_path(daemonset, mount) == str(config.mps_root) and not mount.get("readOnly")
    shm = by_path["/dev/shm"]  # where the MPS servers meet their clients, who mount the same directory
    assert host_path(daemonset, shm) == str(MpsRoot(config.mps_root).shm) and not shm.get("readOnly")
    env = container_env(container, {"spec.nodeName": NODE})
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) == {"compute", "utility"}  # the MPS binaries


def test_control_daemons_run_by_the_daemon_get_the_hosts_pid_namespace_and_privilege(tmp_path: Path) -> None:
    daemonset, config = rendered(mps(), tmp_path)
    assert not config.mps_sidecar
    spec = pod_spec(daemonset)
    assert spec["hostPID"] is True  # an MPS server finds its own PID through /proc/self only there
    assert not spec.get("hostIPC") and not spec.get("hostNetwork")  # MPS meets its clients in the shm
    security = only_container(daemonset)["securityContext"]
    assert security["privileged"] is True and "allowPrivilegeEscalation" not in security  # API refuses both
    assert security["readOnlyRootFilesystem"] is True


def test_with_a_sidecar_the_daemon_stays_unprivileged(tmp_path: Path) -> None:
    daemonset, config = rendered(mps(sidecar=True), tmp_path)
    assert config.mps_sidecar
    spec = pod_spec(daemonset)
    assert not any(spec.get(key) for key in ("hostPID", "hostIPC", "hostNetwork", "initContainers"))
    security = only_container(daemonset)["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("mode", ["hami-core", "mig"])
def test_other_vgpu_modes_carry_nothing_of_mps(mode: str, tmp_path: Path) -> None:
    daemonset, config = rendered(
        {"strategy": "vgpu", "vgpu": {"mode": mode, "mps": {"shmSize": "8g"}}}, tmp_path
    )
    assert config.vgpu_mode == mode
    spec = pod_spec(daemonset)
    assert not spec.get("hostPID") and not spec.get("initContainers")
    container = only_container(daemonset)
    assert container["securityContext"]["privileged"] is False
    assert container_env(container, {"spec.nodeName": NODE})["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert not {str(config.mps_root), "/dev/shm"} & set(mounts(container))


def test_one_node_in_mps_mode_gives_the_daemonset_what_mps_needs(tmp_path: Path) -> None:
    """A node's entry in the HAMi node config runs MPS there; one DaemonSet serves every node."""

    def daemonset_for(*nodes: dict[str, str]) -> Doc:
        values = {"strategy": "vgpu", "vgpu": {"upstreamConfigMaps": True, "nodes": list(nodes)}}
        return find(template(values, tmp_path), "DaemonSet", DAEMON)

    daemonset = daemonset_for({"name": "a10-node", "mode": "mps"}, {"name": NODE})
    assert pod_spec(daemonset)["hostPID"] is True
    assert "/dev/shm" in mounts(only_container(daemonset))
    assert not pod_spec(daemonset_for({"name": "a10-node", "mode": "mig"}, {"name": NODE})).get("hostPID")


def shm_init_container(values: dict[str, Any], where: Path) -> Doc:
    (init,) = pod_spec(find(template(values, where), "DaemonSet", DAEMON))["initContainers"]
    return dict(init)


def test_an_shm_size_mounts_a_tmpfs_on_the_host_at_the_roots_shm(tmp_path: Path) -> None:
    root = "/var/run/gpu-mps"
    init = shm_init_container(mps(root=root, shmSize="16g"), tmp_path)
    assert init["securityContext"] == {"privileged": True}  # mount(2); Bidirectional needs it too
    (mount,) = init["volumeMounts"]
    assert (mount["mountPath"], mount["mountPropagation"]) == (root, "Bidirectional")  # seen by the host
    env = container_env(init, {})
    assert (env["SHM"], env["SIZE"]) == (str(MpsRoot(Path(root)).shm), "16g")


def fake_tools(where: Path, mounted: bool) -> Path:
    """`mountpoint` answering whether the shm is mounted already, `mount` recording its arguments."""
    tools = where / "bin"
    tools.mkdir()
    (tools / "mountpoint").write_text(f"#!/bin/sh\nexit {0 if mounted else 1}\n")
    (tools / "mount").write_text(f'#!/bin/sh\necho "$@" >> {where / "mounts"}\n')
    for tool in tools.iterdir():
        tool.chmod(0o755)
    return tools


@pytest.mark.parametrize("mounted", [False, True])
def test_the_shm_is_mounted_once(mounted: bool, tmp_path: Path) -> None:
    """A restart of the daemon's pod must not hide the tmpfs running containers share with their
    MPS server under a new one: the init container mounts only when nothing is mounted there."""
    init = shm_init_container(mps(shmSize="50%"), tmp_path)
    shm = tmp_path / "root" / "shm"
    env = {**container_env(init, {}), "SHM": str(shm)}
    path = f"{fake_tools(tmp_path, mounted)}:{os.environ['PATH']}"
    done = subprocess.run(
        init["command"], env={**env, "PATH": path}, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert shm.is_dir()
    calls = (tmp_path / "mounts").read_text().splitlines() if (tmp_path / "mounts").exists() else []
    wanted = [] if mounted else [f"-t tmpfs -o rw,nosuid,nodev,noexec,size=50% shm {shm}"]
    assert calls == wanted


@pytest.mark.parametrize(
    ("values", "named_in_error"),
    [
        (mps(root="run/nvidia/mps"), "/vgpu/mps/root"),
        (mps(root="/"), "/vgpu/mps/root"),
        (mps(root="/run/nvidia/mps/"), "/vgpu/mps/root"),
        (mps(sidecar="yes"), "/vgpu/mps/sidecar"),
        (mps(control=""), "/vgpu/mps/control"),
        (mps(shmSize="16Gi"), "/vgpu/mps/shmSize"),
        (mps(sideCar=True), "'sideCar' not allowed"),
        ({"strategy": "vgpu", "vgpu": {"nodes": [{"name": NODE, "mode": "MPS"}]}}, "/vgpu/nodes/0/mode"),
        (
            {
                "strategy": "number",
                "vgpu": {"upstreamConfigMaps": True, "nodes": [{"name": NODE, "mode": "mps"}]},
            },
            "needs strategy: vgpu, not number",
        ),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else None,
)
def test_bad_mps_values_are_refused_by_name(
    values: dict[str, Any], named_in_error: str, tmp_path: Path
) -> None:
    assert named_in_error in refusal(values, tmp_path)
