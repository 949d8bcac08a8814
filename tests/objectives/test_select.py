import pytest

from autotune.errors import BackendUnavailable
from autotune.hardware import DetectedGpus
from autotune.objectives import select
from autotune.objectives.base import get_runner

H200 = DetectedGpus(count=8, device_name="NVIDIA H200", total_mem_gib=140.4, driver="580")


def test_auto_without_gpu_simulates_and_says_so():
    choice = select.choose_backend("auto", None)
    assert choice.name == "sim" and choice.note == "no GPU found: simulating with the calibrated model"


def test_explicit_sim_is_silent():
    assert select.choose_backend("sim", None).note is None


def test_auto_with_gpu_but_no_backend_installed_simulates(monkeypatch):
    monkeypatch.setattr(select, "unavailable_reason", lambda name, gpus: "missing")
    choice = select.choose_backend("auto", H200)
    assert choice.name == "sim" and "found but no probe backend" in choice.note


def test_auto_with_gpu_prefers_verl_then_torch(monkeypatch):
    monkeypatch.setattr(select, "unavailable_reason", lambda name, gpus: None if name == "torch" else "no")
    assert select.choose_backend("auto", H200).name == "torch"


@pytest.mark.parametrize("name", ["torch", "verl"])
def test_unavailable_backend_is_a_clear_error(name):
    with pytest.raises(BackendUnavailable):
        select.choose_backend(name, None)


def test_unknown_backend():
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        select.choose_backend("tpu", None)
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        get_runner("tpu")
