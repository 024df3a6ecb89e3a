"""GPU type and UUID pod filters (semantics reference §3.5 step 5, §3.7; B7)."""

from __future__ import annotations

import pytest

from deviceplugin.fit import ConfigError, type_allowed, uuid_allowed

USE, NOUSE = "nvidia.com/use-gputype", "nvidia.com/nouse-gputype"
V100 = "NVIDIA-Tesla V100-PCIE-32GB"


@pytest.mark.parametrize(
    ("annotations", "card", "volcano", "default"),
    [
        ({}, V100, True, True),
        ({USE: "V100"}, V100, True, True),
        ({USE: "v100"}, V100, True, True),  # case-insensitive
        ({USE: "A100"}, V100, False, False),
        ({USE: "A100,V100"}, V100, True, True),
        ({USE: "A100,T4"}, V100, False, False),
        ({NOUSE: "V100"}, V100, False, False),
        ({NOUSE: "T4"}, V100, True, True),
        ({NOUSE: "T4,v100"}, V100, False, False),
        # Volcano: `use` present means `nouse` is never read; by default both apply.
        ({USE: "Tesla", NOUSE: "V100"}, V100, True, False),
        ({USE: "A100", NOUSE: "T4"}, V100, False, False),
        # Volcano: an empty item is a substring of everything.
        ({USE: "A100,"}, V100, True, False),
        ({NOUSE: "T4,"}, V100, False, True),
        ({USE: ""}, V100, True, True),
        ({NOUSE: ""}, V100, False, True),
        ({NOUSE: " "}, V100, False, True),  # the card type has a space
        # Volcano does not trim items.
        ({USE: "A100, V100"}, V100, True, True),  # " V100" happens to occur in the card type
        ({USE: "A100, PCIE "}, V100, False, True),
        ({NOUSE: " V100-PCIE "}, V100, True, False),
    ],
)
def test_type_allowed(annotations: dict[str, str], card: str, volcano: bool, default: bool) -> None:
    assert type_allowed(annotations, card, "volcano") is volcano
    assert type_allowed(annotations, card) is default


USE_UUID, NOUSE_UUID = "volcano.sh/vgpu-use-gpuuuid", "volcano.sh/vgpu-nouse-gpuuuid"


@pytest.mark.parametrize(
    ("annotations", "uuid", "allowed"),
    [
        ({}, "GPU-1", True),
        ({}, "", True),
        ({USE_UUID: "GPU-1"}, "GPU-1", True),
        ({USE_UUID: "GPU-1"}, "GPU-10", False),  # exact, not substring
        ({USE_UUID: "GPU-1"}, "gpu-1", False),  # exact case
        ({USE_UUID: " GPU-2 , GPU-1 ,"}, "GPU-1", True),  # trimmed, empties dropped
        ({USE_UUID: ",,"}, "GPU-1", True),  # nothing left: no constraint
        ({NOUSE_UUID: "GPU-1"}, "GPU-1", False),
        ({NOUSE_UUID: "GPU-1"}, "GPU-2", True),
        ({USE_UUID: "GPU-1", NOUSE_UUID: "GPU-1"}, "GPU-1", False),  # deny wins
        ({USE_UUID: "GPU-1"}, "", False),  # an active filter refuses a card without UUID
    ],
)
def test_uuid_allowed_same_in_both_modes(annotations: dict[str, str], uuid: str, allowed: bool) -> None:
    assert uuid_allowed(annotations, uuid) is allowed
    assert uuid_allowed(annotations, uuid, "volcano") is allowed


@pytest.mark.parametrize("compat", ["hami", "Volcano", True, 1])
def test_unknown_compat_is_rejected(compat: object) -> None:
    with pytest.raises(ConfigError, match="compat must be None or 'volcano'"):
        type_allowed({}, V100, compat)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        uuid_allowed({}, "GPU-1", compat)  # type: ignore[arg-type]
