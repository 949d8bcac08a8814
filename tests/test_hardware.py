import pytest

from autotune.errors import ConfigError
from autotune.hardware import GPUS, get_gpu, match_device_name


@pytest.mark.parametrize("driver_name, expected", [
    ("NVIDIA H200", "H200"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"),
])
def test_driver_names_map_to_the_right_entry(driver_name, expected):
    assert match_device_name(driver_name).name == expected


def test_unknown_device_is_none():
    assert match_device_name("Tesla T4") is None


def test_peaks_are_verls():
    # verl/utils/flops_counter.py _DEVICE_FLOPS
    assert get_gpu("h200").peak_bf16_flops == 989e12
    assert get_gpu("H20").peak_bf16_flops == 148e12
    assert all(g.mem_gib > 0 and g.source for g in GPUS.values())


def test_unknown_gpu_type():
    with pytest.raises(ConfigError, match="unknown GPU type 'V100'"):
        get_gpu("V100")
