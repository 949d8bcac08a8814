"""The `sim` backend: the calibrated memory and cost model answering in place of a GPU.

Every result it returns is labelled `simulated=True`; the CLI and exports say so. It runs the same
reporting loop as a real probe (one report per step), so pruning and the study driver are exercised
end to end in CI.
"""

from __future__ import annotations

from typing import ClassVar

from autotune.errors import ProbeOOM
from autotune.objectives.base import ProbePruned, ProbeRequest, ProbeResult, ProbeRunner, StepReporter
from autotune.objectives.cost import estimate_step_time
from autotune.objectives.memory import estimate_memory
from autotune.spaces.layout import ParallelLayout


class SimRunner(ProbeRunner):
    name: ClassVar[str] = "sim"
    simulated: ClassVar[bool] = True

    def probe(self, request: ProbeRequest, report: StepReporter) -> ProbeResult:
        layout = ParallelLayout.of(request.candidate, request.workload, gpus_per_node=request.n_gpus,
                                   nodes=request.nodes)
        mem = estimate_memory(request.model, request.gpu, request.workload, request.candidate, layout)
        if not mem.kv_cache_fits:
            raise ProbeOOM(f"(simulated) No available memory for the cache blocks: KV cache {mem.kv_cache_gib:.2f} GiB "
                           f"< {mem.kv_cache_needed_gib:.2f} GiB for one max-length sequence. Try increasing "
                           "gpu_memory_utilization", phase="rollout", over_gib=mem.over_gib, peak_mem_gib=mem.peak_gib)
        if mem.peak_gib > mem.capacity_gib:
            raise ProbeOOM(f"(simulated) CUDA out of memory in {mem.worst_phase}: {mem.peak_gib:.1f} GiB needed of "
                           f"{mem.capacity_gib:.1f} GiB", phase=mem.worst_phase, over_gib=mem.over_gib,
                           peak_mem_gib=mem.peak_gib)
        step = estimate_step_time(request.model, request.gpu, request.workload, request.candidate, layout)
        total_steps = request.warmup_steps + request.timed_steps
        for i in range(1, total_steps + 1):
            if i > request.warmup_steps and report(i, step.tokens_per_s_per_gpu):
                raise ProbePruned(i, step.tokens_per_s_per_gpu)
        timed = request.timed_steps
        return ProbeResult(
            tokens_per_s_per_gpu=step.tokens_per_s_per_gpu, mfu=step.mfu_actor, peak_mem_gib=mem.peak_gib,
            step_s=step.step_s, phase_s=dict(step.phase_s), simulated=True,
            series={"perf/throughput": [step.tokens_per_s_per_gpu] * timed, "timing_s/step": [step.step_s] * timed},
            extra={"memory_phase_gib": mem.phase_peak_gib, "memory_components_gib": mem.components_gib,
                   "kv_cache_gib": mem.kv_cache_gib, "rollout_concurrency": step.rollout_concurrency},
        )
