import pytest

from autotune.errors import BackendUnavailable
from autotune.hardware import DetectedGpus
from autotune.backends import select
from autotune.backends.base import get_runner

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


def test_knobs_whose_package_is_missing_are_held_off_by_real_backends_only(monkeypatch):
    from autotune.backends.verl.runner import VerlRunner

    real_find_spec = select.importlib.util.find_spec
    monkeypatch.setattr(select.importlib.util, "find_spec",
                        lambda name, *a: None if name == "liger_kernel" else real_find_spec(name, *a))
    assert select.knobs_held_off() == {"use_liger": False}
    assert VerlRunner().held_off() == {"use_liger": False}
    assert get_runner("sim").held_off() == {}  # the model prices every knob
    from autotune.spaces.candidate import Candidate
    assert "pip install liger-kernel" in select.knob_package_missing(Candidate(use_liger=True))
    assert select.knob_package_missing(Candidate(use_liger=False)) is None


def test_knobs_are_not_held_off_when_their_package_is_installed(monkeypatch):
    monkeypatch.setattr(select.importlib.util, "find_spec", lambda name, *a: object())
    assert select.knobs_held_off() == {}
