"""`autotune estimate`: one configuration, no search. verl's rule violations, predicted memory per GPU by
component and phase against capacity, predicted time per phase, and how far the nearest fitting
micro-batch, token budget or vLLM share is. All predictions are the calibrated model's (SIMULATED)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.storage.node_profile import phase_factors
from autotune.model.cost import estimate_step_time
from autotune.model.host_memory import estimate_host_memory
from autotune.model.memory import estimate_memory
from autotune.spaces.candidate import Candidate
from autotune.search.prescreen import KV_UP, MONOTONE_UP
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import default_domains
from autotune.workload import Workload

# knob -> the phases whose memory it drives, for the knobs a user lowers to fit (vLLM's batch limits only move its
# KV room, which gpu_memory_utilization's row covers)
LIMITING_KNOBS = {knob: phases for knob, phases in MONOTONE_UP.items() if knob not in KV_UP}


@dataclass(frozen=True)
class Estimate:
    model: str
    gpu: str
    gpus_per_node: int
    nodes: int
    violations: list
    capacity_gib: float
    phase_peak_gib: dict
    components_gib: dict
    kv_cache_gib: float
    kv_cache_needed_gib: float
    fits: bool
    phase_s: dict
    step_s: float
    tokens_per_s_per_gpu: float
    mfu_actor: float
    largest_fitting: dict  # knob -> (current value, largest value of its valid set that fits)
    host_node_gib: float = 0.0  # host RAM one node's workers need for what they offload
    host_per_gpu_gib: dict | None = None
    # the memory above is at max_response_length (the search's gate); this is at the mean response length
    response_max: int = 0
    response_mean: float | None = None  # None: not given (every response is taken to run to the max)
    typical_phase_peak_gib: dict | None = None
    typical_fits: bool | None = None
    mfu_actor_model_flops: float = 0.0  # the FLOPs the update really computes (LoRA: 4N, not verl's 6N)
    simulated: bool = True
    node_profile: dict | None = None  # the profile the times are corrected by (node_profile_for), or why none
    # why verl's per-token log-prob loop is priced (autotune/verl/logprob_path.py), or None where it is not
    logprob_loop: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _applies(knob: str, cand: Candidate) -> bool:
    if knob in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
        return cand.use_dynamic_bsz
    if knob.endswith("micro_batch_size_per_gpu"):
        return not cand.use_dynamic_bsz
    return True


def node_profile_for(gpu: GpuSpec, passthrough: dict, detected=None) -> dict:
    """The profile of this node's kind for a verl job on `gpu` (storage/node_profile.py), or why there is none
    (`detected`: hardware.detect_gpus() when the caller has read it)."""
    from autotune.storage.node_profile import detect_kind, summary_for
    from autotune.verl.rollout import vllm_eager

    kind = detect_kind("verl", passthrough, detected)
    if kind is None:
        return {"none": "no NVIDIA GPU detected here"}
    if kind.gpu != gpu.name:
        return {"none": f"this node is {kind.gpu}, the estimate is for {gpu.name}"}
    return summary_for(kind, "no study has measured this kind of node yet", vllm_eager(passthrough))


def estimate(model: ModelSpec, gpu: GpuSpec, workload: Workload, cand: Candidate, *, gpus_per_node: int,
             nodes: int, profile: dict | None = None, logprob_loop: str | None = None,
             vllm_eager: bool = False) -> Estimate:
    """`profile`: a node profile's summary; its per-phase measured/predicted factors correct the times.
    `logprob_loop`: why verl takes its per-token log-prob loop where the job runs (None: it does not)."""
    layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    violations = [{"rule": v.rule, "message": v.message, "enforced_by": v.enforced_by, "source": v.source}
                  for v in check(model, workload, cand, layout)]
    mem = estimate_memory(model, gpu, workload, cand, layout)
    step = estimate_step_time(model, gpu, workload, cand, layout, logprob_loop=logprob_loop is not None,
                              vllm_eager=vllm_eager)
    domains = default_domains(model, workload, world=layout.world_size, gpus_per_node=gpus_per_node)
    largest = {}
    for knob, phases in LIMITING_KNOBS.items():
        if not _applies(knob, cand):
            continue
        dom = domains[knob]
        values = dom.choices or [round(dom.low + dom.step * i, 4) for i in range(round((dom.high - dom.low) / dom.step) + 1)]
        fitting = []
        for value in sorted(set(values) | {getattr(cand, knob)}):
            trial = cand.with_(**{knob: value})
            m = estimate_memory(model, gpu, workload, trial, ParallelLayout.of(trial, workload, gpus_per_node=gpus_per_node,
                                                                                nodes=nodes))
            ok = all(m.phase_peak_gib.get(p, 0.0) <= m.capacity_gib for p in phases)
            if knob == "gpu_memory_utilization":
                ok = ok and m.kv_cache_fits
            if ok:
                fitting.append(value)
        largest[knob] = {"current": getattr(cand, knob), "largest_fitting": max(fitting) if fitting else None}
    host = estimate_host_memory(model, workload, cand, layout, gpus_per_node=gpus_per_node, capacity_gib=None)
    typical = None
    if workload.mean_response_length is not None:
        typical = estimate_memory(model, gpu, workload, cand, layout, typical=True)
    phase_s, step_s, tps, mfu = dict(step.phase_s), step.step_s, step.tokens_per_s_per_gpu, step.mfu_actor
    mfu_model = step.mfu_actor_model_flops
    factors = phase_factors(profile)
    if factors:
        phase_s = {p: seconds * factors.get(p, 1.0) for p, seconds in step.phase_s.items()}
        step_s = step.step_s + sum(phase_s.values()) - sum(step.phase_s.values())
        tps = step.tokens_per_s_per_gpu * step.step_s / step_s
        slower = factors.get("update_actor", 1.0)
        mfu, mfu_model = mfu / slower, mfu_model / slower
    return Estimate(model=model.name, gpu=gpu.name, gpus_per_node=gpus_per_node, nodes=nodes, violations=violations,
                    capacity_gib=mem.capacity_gib, phase_peak_gib=mem.phase_peak_gib, components_gib=mem.components_gib,
                    kv_cache_gib=mem.kv_cache_gib, kv_cache_needed_gib=mem.kv_cache_needed_gib, fits=mem.fits,
                    phase_s=phase_s, step_s=step_s, tokens_per_s_per_gpu=tps,
                    mfu_actor=mfu, largest_fitting=largest, host_node_gib=host.node_gib,
                    host_per_gpu_gib=host.per_gpu_gib, response_max=workload.max_response_length,
                    response_mean=workload.mean_response_length,
                    typical_phase_peak_gib=typical.phase_peak_gib if typical else None,
                    typical_fits=typical.fits if typical else None,
                    mfu_actor_model_flops=mfu_model, node_profile=profile, logprob_loop=logprob_loop)


def memory_verdict(e: Estimate) -> str:
    """One line: the verdict at max length (the gate) and, when a mean is given, at the mean."""
    at_max = "fits" if e.fits else "PREDICTED OOM"
    over = [p for p, gib in e.phase_peak_gib.items() if gib > e.capacity_gib]
    if e.response_mean is None or e.typical_fits is None:
        return (f"{at_max} with every response at max length {e.response_max} (no mean response length given; "
                "set workload.response_length: {mean, max} for the typical case)")
    if e.fits:
        return f"fits at mean {e.response_mean:g} and with responses at max length {e.response_max}"
    where = f" in {', '.join(over)}" if over else " (vLLM's KV cache)"
    if e.typical_fits:
        return (f"fits at mean {e.response_mean:g}; OOM if responses reach {e.response_max}{where} "
                "(the search rejects it: it checks max length)")
    return f"PREDICTED OOM at mean {e.response_mean:g} and at max length {e.response_max}{where}"


def render(e: Estimate, source: str, unresolved: tuple[str, ...], notes: tuple[str, ...] = ()) -> str:
    lines = [f"{source}: {e.model} on {e.nodes} x {e.gpus_per_node} {e.gpu} ({e.capacity_gib:.1f} GiB each); "
             "all figures SIMULATED by the calibrated model"]
    if e.node_profile is not None:
        from autotune.storage.node_profile import describe_summary

        lines.append(f"  {describe_summary(e.node_profile)}"
                     + ("" if e.node_profile.get("none") else "; the times below are corrected by it"))
    if e.logprob_loop:
        lines.append(f"  verl's per-token log-prob loop is priced ({e.logprob_loop}); model.use_fused_kernels avoids it")
    for name in unresolved:
        lines.append(f"  not read statically: {name}")
    lines += [f"  {note}" for note in notes]
    if e.violations:
        lines.append("verl would refuse it:")
        lines += [f"  {v['rule']}: {v['message']}  [{v['enforced_by']}: {v['source']}]" for v in e.violations]
    else:
        lines.append("verl's rules: all pass")
    lines.append(f"memory per GPU: {memory_verdict(e)}")
    typical = e.typical_phase_peak_gib or {}
    head = f"  peak by phase (GiB), capacity {e.capacity_gib:.1f}: at max length {e.response_max}"
    lines.append(head + (f" | at mean {e.response_mean:g}" if typical else ""))
    for phase, gib in e.phase_peak_gib.items():
        flag = "  <-- over" if gib > e.capacity_gib else ""
        mean_col = f" | {typical[phase]:7.1f}" if phase in typical else ""
        lines.append(f"  {phase:14s} {gib:7.1f}{mean_col}{flag}")
    lines.append("  components: " + ", ".join(f"{k} {v:.1f}" for k, v in e.components_gib.items()))
    kv_flag = "" if e.kv_cache_gib >= e.kv_cache_needed_gib else "  <-- too small: vLLM will not start"
    lines.append(f"  vLLM KV cache {e.kv_cache_gib:.1f} GiB (one max-length sequence needs {e.kv_cache_needed_gib:.2f}){kv_flag}")
    lines.append(f"host memory per node {e.host_node_gib:.1f} GiB ({e.gpus_per_node} workers, each: "
                 + ", ".join(f"{k} {v:.1f}" for k, v in (e.host_per_gpu_gib or {}).items() if v >= 0.05) + ")")
    lines.append(f"time per step {e.step_s:.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in e.phase_s.items())
                 + f"; {e.tokens_per_s_per_gpu:.0f} tokens/s/GPU, actor MFU {e.mfu_actor:.3f} as verl reports it"
                 + (f" (model-FLOPs utilisation {e.mfu_actor_model_flops:.3f}: verl counts 6N FLOPs per token, "
                    "LoRA's frozen base computes 4N)" if abs(e.mfu_actor_model_flops - e.mfu_actor) > 1e-9 else ""))
    lines.append("nearest fitting (largest value of each memory knob that fits, others as given):")
    for knob, v in e.largest_fitting.items():
        lines.append(f"  {knob:40s} now {v['current']!s:>8}  largest fitting {v['largest_fitting']!s:>8}")
    return "\n".join(lines)
