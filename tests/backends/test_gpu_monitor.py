import time
from types import SimpleNamespace

import pytest

from autotune.backends.gpu_monitor import (GpuMonitor, GpuSample, device_peak_gib, idle_fraction_by_phase, phase_windows,
                                             summarize_samples)


class FakeNvml:
    """TEST DOUBLE of pynvml: two GPUs, utilization from a script."""

    def __init__(self, utils):
        self.utils = utils

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.utils[handle])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=(10 + handle) * 2**30)


def test_monitor_samples_every_gpu_in_the_background():
    with GpuMonitor(interval_s=0.01, nvml=FakeNvml([90, 5])) as mon:
        time.sleep(0.1)
    assert mon.available and {s.gpu for s in mon.samples} == {0, 1}
    assert {s.mem_used_gib for s in mon.samples} == {10.0, 11.0}
    series = summarize_samples(mon.samples)
    assert set(series) == {"0", "1"} and series["1"]["util_pct"][0] == 5


def test_monitor_without_nvml_is_a_no_op():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    with GpuMonitor(nvml=Broken([0, 0])) as mon:
        pass
    assert not mon.available and mon.samples == []


def test_phase_windows_walk_back_from_the_step_end():
    w = phase_windows(100.0, {"gen": 50, "old_log_prob": 10, "update_actor": 30, "update_weights": 5, "step": 95})
    assert w == {"update_weights": (95, 100), "update_actor": (65, 95), "old_log_prob": (55, 65), "gen": (5, 55)}


def test_idle_fraction_per_phase():
    samples = [GpuSample(t, 0, util, 1.0) for t, util in [(10, 0), (20, 0), (30, 95), (70, 99), (80, 98)]]
    windows = [{"gen": (5, 55), "update_actor": (65, 95)}]
    idle = idle_fraction_by_phase(samples, windows)
    assert idle["gen"] == pytest.approx(2 / 3) and idle["update_actor"] == 0.0


@pytest.mark.gpu
def test_real_nvml_reads_the_gpu():
    with GpuMonitor(interval_s=0.05) as mon:
        time.sleep(0.3)
    assert mon.available and mon.samples and all(s.mem_used_gib >= 0 for s in mon.samples)


def test_monitor_samples_only_the_gpus_cuda_can_see(monkeypatch):
    # NVML ignores CUDA_VISIBLE_DEVICES (Slurm, containers): another job's GPU must not count as the probe's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with GpuMonitor(interval_s=0.01, nvml=FakeNvml([90, 5])) as mon:
        time.sleep(0.05)
    assert mon.available and {s.mem_used_gib for s in mon.samples} == {11.0}


def test_device_peak_is_the_highest_memory_any_gpu_held():
    samples = [GpuSample(t, gpu, 50.0, used) for t, gpu, used in [(0, 0, 3.0), (1, 0, 89.8), (1, 1, 40.0), (2, 0, 20.0)]]
    assert device_peak_gib(samples) == 89.8 and device_peak_gib([]) is None
