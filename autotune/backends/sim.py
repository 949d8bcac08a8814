"""The `sim` backend: the calibrated memory and cost model answering in place of a GPU.

Every result it returns is labelled `simulated=True`; the CLI and exports say so. It runs the same
reporting loop as a real probe (one report per step), so pruning and the study driver are exercised
end to end in CI. The search benchmark gives it perturbed constants and run-to-run noise, so that it
plays a machine the model does not know exactly (benchmarks/search_efficiency.py).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from typing import ClassVar

from autotune.errors import ProbeOOM
from autotune.backends.base import (ProbePruned, ProbeRequest, ProbeResult, ProbeRunner, StepReporter,
                                    share_launch_wall)
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.cost import estimate_step_time
from autotune.model.memory import estimate_memory
from autotune.verl.rollout import vllm_eager
from autotune.spaces.layout import ParallelLayout

# What a real verl probe costs beside its steps, measured on the H200 studies of 2026-12-03 (1.5B shapes, 1 GPU;
# benchmarks/probe_stages.py, results/probe_stages.txt, median of the 4 probes that ran both steps): 212 s from Ray's
# first stamp to ready-to-fit (the TaskRunner, the model's load and wrap, vLLM's start) plus 21 s from one probe's last
# step to the next one's first stamp (teardown, the next process start); the warm-up step took 2.1x the timed one
# (93 s against 44 s). Larger models start slower; the simulated GPU-hour budget and tuning cost use these.
SIMULATED_STARTUP_S = 232.0
SIMULATED_WARMUP_FACTOR = 2.1


def _progress_only(report: StepReporter) -> StepReporter:
    """A step's progress for its configuration; a shared launch is not pruned (its later steps are others')."""
    def forward(step: int, tokens_per_s: float) -> bool:
        report(step, tokens_per_s)
        return False
    return forward


class SimRunner(ProbeRunner):
    name: ClassVar[str] = "sim"
    simulated: ClassVar[bool] = True

    def __init__(self, constants: ModelConstants = DEFAULT_CONSTANTS, noise_rel: float = 0.0,
                 seed: int | None = None) -> None:
        self.constants = constants
        self.noise_rel = noise_rel  # run-to-run noise of a step's throughput (relative std)
        self._rng = random.Random(seed)

    def probe(self, request: ProbeRequest, report: StepReporter) -> ProbeResult:
        k = self.constants
        layout = ParallelLayout.of(request.candidate, request.workload, gpus_per_node=request.n_gpus,
                                   nodes=request.nodes)
        mem = estimate_memory(request.model, request.gpu, request.workload, request.candidate, layout, constants=k)
        predicted_oom = None
        if request.users_job and (not mem.kv_cache_fits or mem.peak_gib > mem.capacity_gib):
            # the user's job runs where they run it: the model's OOM is shown, not played (the job stays the baseline)
            predicted_oom = (f"the model predicts OOM: {mem.peak_gib:.1f} GiB in {mem.worst_phase} of "
                             f"{mem.capacity_gib:.1f} GiB" + ("" if mem.kv_cache_fits else " (no room for the KV "
                                                              "cache)") + "; simulated as your job runs")
        elif not mem.kv_cache_fits:
            raise ProbeOOM(f"(simulated) No available memory for the cache blocks: KV cache {mem.kv_cache_gib:.2f} GiB "
                           f"< {mem.kv_cache_needed_gib:.2f} GiB for one max-length sequence. Try increasing "
                           "gpu_memory_utilization", phase="rollout", over_gib=mem.over_gib, peak_mem_gib=mem.peak_gib,
                           kind="kv_cache_too_small")
        elif mem.peak_gib > mem.capacity_gib:
            raise ProbeOOM(f"(simulated) CUDA out of memory in {mem.worst_phase}: {mem.peak_gib:.1f} GiB needed of "
                           f"{mem.capacity_gib:.1f} GiB", phase=mem.worst_phase, over_gib=mem.over_gib,
                           peak_mem_gib=mem.peak_gib)
        step = estimate_step_time(request.model, request.gpu, request.workload, request.candidate, layout,
                                  constants=k, logprob_loop=request.logprob_loop,
                                  vllm_eager=vllm_eager(request.passthrough))
        series: list[float] = []
        for i in range(1, request.warmup_steps + request.timed_steps + 1):
            tokens_per_s = step.tokens_per_s_per_gpu * self._noise()
            if i <= request.warmup_steps:
                continue
            series.append(tokens_per_s)
            if report(i, tokens_per_s):
                raise ProbePruned(i, tokens_per_s)
        median = statistics.median(series)  # gpt-fast style: median of the timed steps
        warmup_s = SIMULATED_WARMUP_FACTOR * step.step_s
        ends = [SIMULATED_STARTUP_S + warmup_s * min(i, request.warmup_steps)
                + step.step_s * max(i - request.warmup_steps, 0)
                for i in range(1, request.warmup_steps + request.timed_steps + 1)]
        wall_s = ends[-1]
        return ProbeResult(
            tokens_per_s_per_gpu=median, mfu=step.mfu_actor, peak_mem_gib=mem.peak_gib,
            step_s=step.step_s, phase_s=dict(step.phase_s), simulated=True,
            series={"perf/throughput": series, "timing_s/step": [step.step_s] * len(series)},
            extra={"memory_phase_gib": mem.phase_peak_gib, "memory_components_gib": mem.components_gib,
                   "kv_cache_gib": mem.kv_cache_gib, "rollout_concurrency": step.rollout_concurrency,
                   "probe_wall_s": wall_s, **({"predicted_oom": predicted_oom} if predicted_oom else {}),
                   "stage_s": {"ready_to_fit": SIMULATED_STARTUP_S,
                               **{f"step{i}": round(t, 2) for i, t in enumerate(ends, 1)}, "end": round(wall_s, 2)}},
        )

    def can_share(self, request: ProbeRequest) -> bool:
        return True

    def probe_group(self, requests: list[ProbeRequest], reports: list[StepReporter]) -> list:
        return simulated_group(self, requests, reports)

    def _noise(self) -> float:
        return max(self._rng.gauss(1.0, self.noise_rel), 0.5) if self.noise_rel else 1.0


def simulated_group(runner: ProbeRunner, requests: list[ProbeRequest], reports: list[StepReporter]) -> list:
    """A simulated shared launch of `runner`'s probes (backends/verl/shared_launch.py does it for real): one start-up,
    the first configuration's warm-up, then each one's timed steps; an OOM ends the launch and the rest start again.
    The launch's simulated wall time is shared among the configurations it decided, as a real one's is. The search
    benchmark's truth machines launch the same way (benchmarks/truths.py)."""
    outcomes: list = [None] * len(requests)
    pending = list(range(len(requests)))
    while pending:
        wall_s, decided, stages = SIMULATED_STARTUP_S, [], {"ready_to_fit": SIMULATED_STARTUP_S}
        launch = {"trials": [requests[j].trial_number for j in pending], "simulated": True}
        for position, i in enumerate(pending):
            request = requests[i] if position == 0 else replace(requests[i], warmup_steps=0)
            decided.append(i)
            try:
                result = runner.probe(request, _progress_only(reports[i]))
            except ProbeOOM as exc:
                outcomes[i] = exc
                break
            outcomes[i] = result
            for _ in range(request.warmup_steps):
                wall_s += SIMULATED_WARMUP_FACTOR * result.step_s
                stages[f"step{len(stages)}"] = round(wall_s, 2)
            for _ in range(request.timed_steps):
                wall_s += result.step_s
                stages[f"step{len(stages)}"] = round(wall_s, 2)
            result.extra["launch"] = {**launch, "index": position}
        stages["end"] = round(wall_s, 2)
        share_launch_wall([outcomes[i] for i in decided], wall_s)
        for i in decided:
            if isinstance(outcomes[i], ProbeResult):
                outcomes[i].extra["stage_s"] = stages
        pending = [i for i in pending if outcomes[i] is None]
    return outcomes
