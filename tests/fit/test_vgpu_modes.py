"""Sharing modes (docs/fit.md, "Sharing modes"): a pod's `volcano.sh/vgpu-mode` picks the cards of
that mode, read from the node's registration as a daemon writes it (field 6). By default each card
has its own mode: `mig` fits only MIG cards, `mps` only MPS cards, `hami-core` only HAMi-core
cards, no annotation any card. compat="volcano" is Volcano's rule: the node's mode is its last
card's, an `mps` card reads as `hami-core`, so an `mps` pod fits nowhere (B14)."""

from __future__ import annotations

import pytest

from deviceplugin.fit import Compat, FitResult, GpuState, VgpuConfig, fit_vgpu, parse_vgpu_requests, vgpu_gpus
from deviceplugin.fit import keys as k
from deviceplugin.fit.mig_tables import builtin_geometries
from tests.fit.builders import MEM, NUM, container, pod, vgpu_node

CONFIG = VgpuConfig(mig_geometries=builtin_geometries())
H100 = "NVIDIA-NVIDIA H100 80GB HBM3"


def card(index: int, mode: str, kind: str = "NVIDIA-NVIDIA A10", memory: int = 23028) -> GpuState:
    return GpuState(index=index, uuid=f"GPU-{mode}-{index}", type=kind, memory=memory, mode=mode)


MIXED = (card(0, k.MODE_HAMI_CORE), card(1, k.MODE_MPS), card(2, k.MODE_MIG, H100, 81559))


def fit(cards: tuple[GpuState, ...], mode: str | None, nums: int = 1, compat: Compat = None) -> FitResult:
    gpus = vgpu_gpus(vgpu_node(cards), config=CONFIG, compat=compat)
    notes = {k.VGPU_MODE: mode} if mode is not None else {}
    p = pod("p", [container("c", {NUM: str(nums), MEM: "8000"})], annotations=notes)
    return fit_vgpu(gpus, parse_vgpu_requests(p, CONFIG, compat), p, "binpack", compat, config=CONFIG)


def devices(result: FitResult) -> list[str]:
    assert result.ok, result.reason
    return sorted(device.uuid for devices in result.devices for device in devices)


@pytest.mark.parametrize(
    ("mode", "chosen"),
    [
        (k.MODE_MIG, ["GPU-mig-2[group1-0]"]),
        (k.MODE_MPS, ["GPU-mps-1"]),
        (k.MODE_HAMI_CORE, ["GPU-hami-core-0"]),
    ],
)
def test_a_pod_asking_a_mode_fits_only_the_cards_of_that_mode(mode: str, chosen: list[str]) -> None:
    assert devices(fit(MIXED, mode)) == chosen
    refused = fit(MIXED, mode, nums=2)
    assert not refused.ok
    others = [gpu for gpu in MIXED if gpu.mode != mode]
    for other in others:
        assert f"GPU {other.index} ({other.uuid}): runs {other.mode}, pod asks for {mode}" in refused.reason


def test_a_pod_asking_no_mode_fits_every_card_each_in_its_own_way() -> None:
    for one in MIXED:
        assert devices(fit((one,), None)) == [one.uuid if one.mode != k.MODE_MIG else f"{one.uuid}[group1-0]"]
    assert devices(fit(MIXED, None, nums=2)) == ["GPU-hami-core-0", "GPU-mig-2[group1-0]"]


@pytest.mark.parametrize("mode", [None, k.MODE_MPS])
def test_an_mps_card_serves_only_containers_of_one_gpu(mode: str | None) -> None:
    """A CUDA process connects to one MPS control daemon, one per GPU: the daemon refuses a
    container of two GPUs there (`mps-one-gpu`), so the fit does not send it."""
    mps_node = (card(0, k.MODE_MPS), card(1, k.MODE_MPS))
    assert devices(fit(mps_node, mode)) == ["GPU-mps-0"]
    refused = fit(mps_node, mode, nums=2)
    assert not refused.ok
    assert "GPU 0 (GPU-mps-0): runs mps, which serves a container one GPU; it asks for 2" in refused.reason
    assert not fit(MIXED, None, nums=3).ok


def test_volcano_sends_a_container_of_several_gpus_to_mps_cards_as_hami_core() -> None:
    mps_node = (card(0, k.MODE_MPS), card(1, k.MODE_MPS))
    assert devices(fit(mps_node, None, nums=2, compat="volcano")) == ["GPU-mps-0", "GPU-mps-1"]


def test_volcano_reads_an_mps_card_as_hami_core_so_an_mps_pod_fits_nowhere() -> None:
    mps_node = (card(0, k.MODE_MPS), card(1, k.MODE_MPS))
    assert [gpu.mode for gpu in vgpu_gpus(vgpu_node(mps_node), config=CONFIG, compat="volcano")] == [
        k.MODE_HAMI_CORE,
        k.MODE_HAMI_CORE,
    ]
    refused = fit(mps_node, k.MODE_MPS, compat="volcano")
    assert not refused.ok
    assert "asks for sharing mode 'mps'; the node runs 'hami-core'" in refused.reason
    assert fit(mps_node, k.MODE_HAMI_CORE, compat="volcano").ok
    assert fit(mps_node, k.MODE_MPS).ok  # the default serves it


@pytest.mark.parametrize("compat", [None, "volcano"])
def test_a_mig_pod_fits_a_mig_node_and_not_a_hami_core_one(compat: Compat) -> None:
    mig_node = (card(0, k.MODE_MIG, H100, 81559),)
    assert devices(fit(mig_node, k.MODE_MIG, compat=compat)) == ["GPU-mig-0[group1-0]"]
    assert devices(fit(mig_node, None, compat=compat)) == ["GPU-mig-0[group1-0]"]
    assert not fit((card(0, k.MODE_HAMI_CORE),), k.MODE_MIG, compat=compat).ok
