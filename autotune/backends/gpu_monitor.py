"""Sample GPU utilization and memory with NVML while a probe runs (what people do by watching nvidia-smi).

A background thread reads every visible GPU each `interval_s`. Phase windows are reconstructed from
verl's per-step `timing_s/*` durations and the time each step's metrics arrived (verl runs the phases of
a step in this order: gen, old_log_prob, ref, update_actor, update_weights; trainer_base.py), so the idle
fraction per phase is approximate at the phase edges.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.hardware import visible_handles

PHASE_ORDER = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")
IDLE_UTIL_PCT = 10.0  # below this an SM-utilization sample counts as idle


@dataclass(frozen=True)
class GpuSample:
    t_s: float  # time.monotonic()
    gpu: int
    util_pct: float
    mem_used_gib: float


class GpuMonitor:
    """Context manager: `with GpuMonitor() as mon: ...; mon.samples`. No-op when NVML is unavailable."""

    def __init__(self, interval_s: float = 1.0, nvml=None) -> None:
        self.interval_s = interval_s
        self.samples: list[GpuSample] = []
        self.available = False
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list = []

    def __enter__(self) -> "GpuMonitor":
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                return self
        try:
            nvml.nvmlInit()
            # the GPUs the probe can use (NVML ignores CUDA_VISIBLE_DEVICES; another job's GPU is not ours)
            self._handles = visible_handles(nvml)
        except Exception:  # no driver / no GPU: monitoring is best effort
            return self
        self._nvml = nvml
        self.available = True
        self._thread = threading.Thread(target=self._run, name="autotune-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def sample_once(self) -> None:
        now = time.monotonic()
        for index, handle in enumerate(self._handles):
            util = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
            self.samples.append(GpuSample(now, index, float(util), float(mem)))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:
                return
            self._stop.wait(self.interval_s)


def phase_windows(step_end_s: float, phase_s: dict[str, float]) -> dict[str, tuple[float, float]]:
    """(start, end) of each phase of one step, walking back from the step's end."""
    windows: dict[str, tuple[float, float]] = {}
    end = step_end_s
    for phase in reversed(PHASE_ORDER):
        duration = phase_s.get(phase)
        if not duration:
            continue
        windows[phase] = (end - duration, end)
        end -= duration
    return windows


def idle_fraction_by_phase(samples: Sequence[GpuSample],
                           windows: Sequence[dict[str, tuple[float, float]]]) -> dict[str, float]:
    """Share of GPU samples below IDLE_UTIL_PCT inside each phase's windows, over all GPUs and steps."""
    totals: dict[str, list[int]] = {}
    for step_windows in windows:
        for phase, (start, end) in step_windows.items():
            inside = [s for s in samples if start <= s.t_s <= end]
            count = totals.setdefault(phase, [0, 0])
            count[0] += sum(s.util_pct < IDLE_UTIL_PCT for s in inside)
            count[1] += len(inside)
    return {phase: idle / n for phase, (idle, n) in totals.items() if n}


def device_peak_gib(samples: Sequence[GpuSample]) -> float | None:
    """The highest memory any sampled GPU held, every process on it counted (NVML's `used`): for verl that
    includes vLLM's weights and KV cache, which live in the rollout server's process, not the trainer's."""
    return max((s.mem_used_gib for s in samples), default=None)


def summarize_samples(samples: Sequence[GpuSample], max_points: int = 600) -> dict:
    """Per-GPU series for storage on the trial, thinned to at most `max_points` per GPU."""
    out: dict[str, dict[str, list[float]]] = {}
    if not samples:
        return out
    t0 = min(s.t_s for s in samples)
    by_gpu: dict[int, list[GpuSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    for gpu, rows in by_gpu.items():
        step = max(1, len(rows) // max_points)
        rows = rows[::step]
        out[str(gpu)] = {"t_s": [round(s.t_s - t0, 2) for s in rows], "util_pct": [s.util_pct for s in rows],
                         "mem_used_gib": [round(s.mem_used_gib, 3) for s in rows]}
    return out
