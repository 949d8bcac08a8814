"""The search benchmark's "real machines": truths that differ from the cost model in structure, not only scale.

Every truth starts from the model with its constants rescaled (log-normal per constant, PERTURBATION; the
benchmark's only truth before issue 19) and adds one effect the model lacks:

  rescaled        nothing more
  preemption      vLLM preemption cliff: when max_num_seqs sequences of full length do not fit in the KV
                  cache, vLLM admits them anyway and preempts (recomputes) as they grow; generation takes
                  1.5x the model's time
  host_floor      the per-micro-batch host floor (HF eager modules and FSDP hooks) is 3x the model's
  tp_comm         Megatron TP communication grows superlinearly: Megatron phases take 1 + 0.05 (TP^1.5 - 1)
                  times the model's time (TP 2: 1.09, TP 4: 1.35, TP 8: 2.08)
  fragmentation   +8% memory in a training phase whose largest micro-batch holds >= 16k tokens per GPU
  fast_engine     the Megatron engine is 20% faster than the model believes (its phases take 1/1.2)
  rollout_tp      rollout TP scales worse: generation takes TP^0.25 times the model's time
  layout_sigmaS   each actor layout (engine, TP, PP, VPP, CP, EP, ETP, Ulysses) gets its own factor on the
                  update phase and another on the log-prob passes, and each rollout setting (rollout TP,
                  max_num_seqs, chunked prefill) one on generation, log-normal with sigma S (median 1)
  quirk_sigmaS    issue 34's per-layout and per-flag quirks: layout_sigmaS, and each system flag that is on
                  (checkpointing, Liger, dynamic batching, the offloads) its own factor on the update and
                  another on the log-prob passes, log-normal with the same sigma

Each keeps the structure the exact optimum's decomposition relies on (benchmarks/optimum.py): generation
depends on the rollout knobs only, each training phase on the layout and its own micro-batch knobs.
"""

from __future__ import annotations

import math
import random
import statistics
import zlib
from dataclasses import dataclass, fields, replace
from pathlib import Path

from autotune.errors import ProbeOOM
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import ProbePruned, ProbeRequest, ProbeResult, ProbeRunner
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.cost import estimate_step_time
from autotune.model.memory import (estimate_memory, tokens_per_micro_batch,
                                        vllm_kv_cache_bytes)
from autotune.backends.sim import SIMULATED_STARTUP_S, simulated_group
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout

NOISE_REL = 0.03  # run-to-run noise of each phase per step (relative std)
# relative std of the log-normal factor applied to each constant, by how well it is known
PERTURBATION = {"activations": 0.08, "throughput": 0.08, "rollout": 0.20, "system": 0.15}
TRAIN_PHASES = ("update_actor", "old_log_prob", "ref")
LAYOUT_KNOBS = ("actor_engine", "actor_tp", "actor_pp", "actor_vpp", "actor_cp", "actor_ep", "actor_etp", "ulysses_sp")
ROLLOUT_SETTING = ("rollout_tp", "max_num_seqs", "enable_chunked_prefill")
QUIRK_FLAGS = ("gradient_checkpointing", "use_liger", "use_dynamic_bsz", "param_offload", "optimizer_offload",
               "ref_param_offload", "activation_offload", "use_torch_compile", "use_remove_padding")
FRAGMENTATION_TOKENS = 16384
PREEMPTION_SLOWDOWN = 1.5


@dataclass(frozen=True)
class Truth:
    name: str
    effect: str
    sigma: float = 0.0


TRUTHS = [Truth("rescaled", "rescaled"), Truth("preemption", "preemption"), Truth("host_floor", "host_floor"),
          Truth("tp_comm", "tp_comm"), Truth("fragmentation", "fragmentation"), Truth("fast_engine", "fast_engine"),
          Truth("rollout_tp", "rollout_tp"), Truth("layout_sigma0.10", "layout", 0.10),
          Truth("layout_sigma0.15", "layout", 0.15), Truth("layout_sigma0.25", "layout", 0.25),
          Truth("quirk_sigma0.15", "quirk", 0.15)]
TRUTH_BY_NAME = {t.name: t for t in TRUTHS}


def perturbed(seed: int) -> ModelConstants:
    """One machine's constants: each drawn on its own from (machine, group, name), so a constant added to the model
    later leaves every other one of every machine as it was (a shared draw sequence re-drew all machines whenever a
    field was added: machine 90's 7B optimum moved 7576 -> 6671 tokens/s/GPU with the log-prob loop's constants,
    2026-12-06, and a search benchmark before and after compared different machines)."""

    def scale(group: str):
        obj, rel = getattr(DEFAULT_CONSTANTS, group), PERTURBATION[group]
        changes = {}
        for f in fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, float) and value > 0:
                factor = _lognormal(seed, ("constant", group, f.name), rel)
                new = value * factor
                if f.name in ("allocator_fragmentation",):
                    new = max(1.0, 1.0 + (value - 1.0) * factor)
                if f.name in ("comm_overlap", "collective_efficiency", "host_link_efficiency",
                              "decode_hbm_efficiency", "prefill_mfu", "mfu_max_cap", "chunked_prefill_stall",
                              "unchunked_prefill_stall", "fsdp2_memory_factor"):
                    new = min(new, 0.98)
                changes[f.name] = new
        return replace(obj, **changes)

    return ModelConstants(**{group: scale(group) for group in ("activations", "throughput", "rollout", "system")})


def _lognormal(seed: int, key: tuple, sigma: float) -> float:
    """A factor drawn once per (machine, key), the same in every process (crc32, not Python's salted hash)."""
    rng = random.Random(zlib.crc32(repr((seed,) + key).encode()))
    return math.exp(rng.gauss(0.0, sigma))


class TruthEvaluator:
    """cand -> (rule ids, MemoryEstimate, StepTime) on one machine: the exact optimum's and the probes' truth."""

    def __init__(self, model, gpu, workload, gpus_per_node: int, nodes: int, truth: Truth, machine_seed: int):
        self.model, self.gpu, self.workload = model, gpu, workload
        self.gpus_per_node, self.nodes, self.truth, self.seed = gpus_per_node, nodes, truth, machine_seed
        k = perturbed(machine_seed)
        if truth.effect == "host_floor":
            k = replace(k, throughput=replace(k.throughput, host_s_per_layer_pass=3 * k.throughput.host_s_per_layer_pass))
        self.k = k

    def __call__(self, cand: Candidate):
        layout = ParallelLayout.of(cand, self.workload, gpus_per_node=self.gpus_per_node, nodes=self.nodes)
        rules = {v.rule for v in check(self.model, self.workload, cand, layout)}
        mem = estimate_memory(self.model, self.gpu, self.workload, cand, layout, constants=self.k)
        step = estimate_step_time(self.model, self.gpu, self.workload, cand, layout, constants=self.k)
        phase = dict(step.phase_s)
        peaks = dict(mem.phase_peak_gib)
        effect, tp = self.truth.effect, cand.actor_tp if cand.is_megatron else 1
        if effect == "preemption":
            kv_tokens = (vllm_kv_cache_bytes(self.model, self.gpu, cand, self.k)
                         / self.model.kv_cache_bytes_per_token(cand.rollout_tp))
            seqs = self.workload.trajectories_per_step / max(layout.rollout_replicas, 1)
            full = self.workload.prompt_fill * self.workload.max_prompt_length + self.workload.max_response_length
            if min(cand.max_num_seqs, seqs) * full > kv_tokens:
                phase["gen"] *= PREEMPTION_SLOWDOWN
        elif effect in ("tp_comm", "fast_engine") and cand.is_megatron:
            factor = 1 + 0.05 * (tp ** 1.5 - 1) if effect == "tp_comm" else 1 / 1.2
            for p in TRAIN_PHASES:
                if p in phase:
                    phase[p] *= factor
        elif effect == "rollout_tp":
            phase["gen"] *= cand.rollout_tp ** 0.25
        elif effect == "fragmentation":
            for p, fwd, role in (("update_actor", False, "actor"), ("old_log_prob", True, "actor"),
                                 ("ref", True, "ref")):
                if p in peaks and tokens_per_micro_batch(cand, self.workload, forward_only=fwd, role=role,
                                                         layout=layout) >= FRAGMENTATION_TOKENS:
                    peaks[p] *= 1.08
        if effect == "quirk":  # the layout's factors (below) and one per flag that is on
            for flag in QUIRK_FLAGS:
                if getattr(cand, flag):
                    phase["update_actor"] *= _lognormal(self.seed, ("flag-update", flag), self.truth.sigma)
                    for p in ("old_log_prob", "ref"):
                        if p in phase:
                            phase[p] *= _lognormal(self.seed, ("flag-forward", flag), self.truth.sigma)
        if effect in ("layout", "quirk"):
            lay = tuple(getattr(cand, n) for n in LAYOUT_KNOBS)
            phase["update_actor"] *= _lognormal(self.seed, ("update",) + lay, self.truth.sigma)
            for p in ("old_log_prob", "ref"):
                if p in phase:
                    phase[p] *= _lognormal(self.seed, ("forward",) + lay, self.truth.sigma)
            phase["gen"] *= _lognormal(self.seed, ("gen",) + tuple(getattr(cand, n) for n in ROLLOUT_SETTING),
                                       self.truth.sigma)
        if phase != step.phase_s:
            step_s = sum(phase.values()) + self.k.system.step_fixed_s
            step = replace(step, phase_s=phase, step_s=step_s,
                           tokens_per_s_per_gpu=step.tokens_per_step / step_s / layout.world_size)
        if peaks != mem.phase_peak_gib:
            mem = replace(mem, phase_peak_gib=peaks, worst_phase=max(peaks, key=peaks.get))
        return rules, mem, step


class TruthRunner(ProbeRunner):
    """A probe on the truth machine: its OOMs, and per-phase times with run-to-run noise per step."""

    name = "sim"
    simulated = True
    deterministic = False  # a probe of the same configuration again draws new noise: confirmation applies

    def __init__(self, evaluator: TruthEvaluator, seed: int, probe_sigma: float = 0.0) -> None:
        self.ev = evaluator
        self._rng = random.Random(seed)
        # one log-normal factor per probe on all its steps (issue 34: the same configuration on two H200s, 25%): what
        # a repeat inside one probe does not see
        self.probe_sigma = probe_sigma
        # launches that measure several configurations, as verl's do (benchmarks/launch_size.py): one start-up and
        # one noise factor for all of a launch's members (what the launch's node and processes add); off unless a
        # benchmark turns it on
        self.share = False
        self._launch_slow: float | None = None

    def can_share(self, request: ProbeRequest) -> bool:
        return self.share

    def probe_group(self, requests: list[ProbeRequest], reports: list) -> list:
        self._launch_slow = math.exp(self._rng.gauss(0.0, self.probe_sigma)) if self.probe_sigma else 1.0
        try:
            return simulated_group(self, requests, reports)
        finally:
            self._launch_slow = None

    def probe(self, request: ProbeRequest, report) -> ProbeResult:
        _, mem, step = self.ev(request.candidate)
        if not mem.kv_cache_fits:
            raise ProbeOOM("(simulated) No available memory for the cache blocks", phase="rollout",
                           over_gib=mem.over_gib, peak_mem_gib=mem.peak_gib, kind="kv_cache_too_small")
        if mem.peak_gib > mem.capacity_gib:
            raise ProbeOOM(f"(simulated) CUDA out of memory in {mem.worst_phase}", phase=mem.worst_phase,
                           over_gib=mem.over_gib, peak_mem_gib=mem.peak_gib)
        world = request.n_gpus * request.nodes
        fixed_s = step.step_s - sum(step.phase_s.values())
        series, phases, steps = [], [], []
        slow = (self._launch_slow if self._launch_slow is not None
                else math.exp(self._rng.gauss(0.0, self.probe_sigma)) if self.probe_sigma else 1.0)
        for i in range(1, request.warmup_steps + request.timed_steps + 1):
            phase = {p: s * slow * max(self._rng.gauss(1.0, NOISE_REL), 0.5) for p, s in step.phase_s.items()}
            step_s = fixed_s + sum(phase.values())
            tokens_per_s = step.tokens_per_step / step_s / world
            if i <= request.warmup_steps:
                continue
            series.append(tokens_per_s)
            phases.append(phase)
            steps.append(step_s)
            if report(i, tokens_per_s):
                raise ProbePruned(i, tokens_per_s)
        return ProbeResult(tokens_per_s_per_gpu=statistics.median(series), mfu=step.mfu_actor,
                           peak_mem_gib=mem.peak_gib, step_s=statistics.median(steps),
                           phase_s={p: statistics.median(ph[p] for ph in phases) for p in step.phase_s},
                           simulated=True, series={"perf/throughput": series},
                           extra={"probe_wall_s": SIMULATED_STARTUP_S + len(steps) * step.step_s})


class Machine:
    """One (truth, machine seed): its evaluator, a noisy probe and its noiseless truth."""

    def __init__(self, job, truth: Truth, machine_seed: int, run_seed: int, probe_sigma: float = 0.0) -> None:
        self.job, self.truth_spec, self.seed = job, truth, run_seed
        self.model, self.gpu = get_model(job.model), get_gpu("H200")
        self.ev = TruthEvaluator(self.model, self.gpu, job.workload, job.gpus_per_node, job.nodes, truth, machine_seed)
        self.runner = TruthRunner(self.ev, seed=run_seed, probe_sigma=probe_sigma)

    def truth(self, cand: Candidate, workload) -> float:
        rules, mem, step = self.ev(cand)
        return 0.0 if rules or not mem.fits else step.tokens_per_s_per_gpu

    def probe(self, cand: Candidate, workload) -> tuple[str, float]:
        """('ok', measured) | ('oom', 0) | ('rejected', 0): what a launch of this candidate gives."""
        layout = ParallelLayout.of(cand, workload, gpus_per_node=self.job.gpus_per_node, nodes=self.job.nodes)
        if check(self.model, workload, cand, layout):
            return "rejected", 0.0
        request = ProbeRequest(model=self.model, gpu=self.gpu, n_gpus=self.job.gpus_per_node, nodes=self.job.nodes,
                               workload=workload, candidate=cand, run_dir=Path("/nonexistent"))
        try:
            return "ok", self.runner.probe(request, lambda *_: False).tokens_per_s_per_gpu
        except ProbeOOM:
            return "oom", 0.0
