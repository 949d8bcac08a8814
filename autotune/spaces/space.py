"""The GRPO search space: which values each knob may take for this model, GPU count and workload.

Values are drawn only from sets that can be valid (divisors of the world size and of the head,
layer and expert counts; powers of two for batch knobs), so the sampler does not waste trials on
layouts verl would refuse for arithmetic reasons alone. Choice lists are fixed per study (Optuna
rejects categorical choices that change between trials). Knobs that only apply under another knob
(Megatron sizes, token budgets) are suggested only where they apply, which Optuna's grouped
multivariate TPE models as sub-spaces.
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import optuna

from autotune.errors import ConfigError
from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

ENGINES = ("fsdp", "fsdp2", "megatron")
# keys.py rows, engines=FSDP
FSDP_ONLY = ("ulysses_sp", "activation_offload", "use_liger", "use_torch_compile", "use_fused_kernels")
MEGATRON_ONLY = ("actor_tp", "actor_pp", "actor_vpp", "actor_cp", "actor_ep", "actor_etp", "cuda_device_max_connections")
STATIC_ONLY = ("ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu")
DYNAMIC_ONLY = ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu")
# searched only with a separate reference model (autotune/verl/roles.py)
REF_ONLY = ("ref_log_prob_micro_batch_size_per_gpu", "ref_param_offload")
# Knobs whose valid values follow from the model and GPU count alone: a user list is checked against them.
STRUCTURAL = ("actor_engine", "actor_tp", "actor_pp", "actor_vpp", "actor_cp", "actor_ep", "actor_etp", "ulysses_sp",
              "rollout_tp")
# Workload knobs a user may opt in to tuning (tune.yaml `tune_workload`); everything else in
# Workload stays the user's.
TUNABLE_WORKLOAD = ("ppo_mini_batch_size",)


@dataclass(frozen=True)
class Domain:
    """Choices of one knob: a fixed ordered list, or a float range with a step."""

    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None

    def contains(self, value) -> bool:
        if self.choices:
            return value in self.choices
        return self.low - 1e-9 <= value <= self.high + 1e-9

    def suggest(self, trial: optuna.Trial, name: str):
        if self.choices:
            return trial.suggest_categorical(name, list(self.choices))
        return trial.suggest_float(name, self.low, self.high, step=self.step)

    def values(self) -> list:
        """Every value: the choices, or the range's grid points."""
        if self.choices:
            return list(self.choices)
        return [round(self.low + self.step * i, 6) for i in range(round((self.high - self.low) / self.step) + 1)]

    def describe(self) -> str:
        if self.choices:
            return ", ".join(str(c) for c in self.choices)
        return f"{self.low:g}..{self.high:g} step {self.step:g}"


def _pow2_upto(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _divisors_pow2(n: int, limit: int | None = None) -> list[int]:
    return [d for d in _pow2_upto(limit or n) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    domains: dict[str, Domain]
    fixed: dict[str, object] = field(default_factory=dict)  # knob -> pinned value
    workload_domains: dict[str, Domain] = field(default_factory=dict)  # opted-in workload knobs

    # ---- building -------------------------------------------------------------------------------------
    @classmethod
    def build(cls, model: ModelSpec, workload: Workload, *, gpus_per_node: int, nodes: int,
              fixed: Mapping[str, object] | None = None, ranges: Mapping[str, object] | None = None,
              tune_workload: Sequence[str] = (), holds: Sequence = ()) -> "SearchSpace":
        """`holds`: knobs the user's own job holds at its values (autotune/verl/engines.py holds)."""
        world = gpus_per_node * nodes
        domains = default_domains(model, workload, world=world, gpus_per_node=gpus_per_node)
        fixed = dict(fixed or {})
        for name, value in fixed.items():
            if name not in domains:
                raise ConfigError(f"tune.yaml fixed: unknown knob {name!r}; knobs: {', '.join(domains)}")
            _check_type(name, value)
            if name in STRUCTURAL and not domains[name].contains(value):
                raise ConfigError(f"tune.yaml fixed: {name}={value!r} can never be valid for {model.name} on "
                                  f"{world} GPUs (valid: {domains[name].describe()})")
        _check_engine_pins(fixed)
        for name, spec in (ranges or {}).items():
            if name in TUNABLE_WORKLOAD:
                if name not in tune_workload:
                    raise ConfigError(f"tune.yaml ranges.{name}: {name} is a workload knob and is held at your value; "
                                      f"add it to tune_workload to tune it")
                continue
            if name not in domains:
                raise ConfigError(f"tune.yaml ranges: unknown knob {name!r}; knobs: {', '.join(domains)}")
            domains[name] = _narrow(name, domains[name], spec, structural=name in STRUCTURAL)
        for hold in holds:
            domains[hold.knob] = _held(domains[hold.knob], fixed.get(hold.knob), hold)
        workload_domains = {}
        for name in tune_workload:
            if name not in TUNABLE_WORKLOAD:
                raise ConfigError(f"tune_workload: {name!r} cannot be tuned; opt-in workload knobs: "
                                  f"{', '.join(TUNABLE_WORKLOAD)}")
            default = Domain(choices=tuple(d for d in _divisors_pow2_or_all(workload.train_batch_size)
                                           if d * workload.rollout_n % world == 0 or d == workload.ppo_mini_batch_size))
            spec = (ranges or {}).get(name)
            workload_domains[name] = _narrow(name, default, spec) if spec is not None else default
        return cls(domains=domains, fixed=fixed, workload_domains=workload_domains)

    # ---- sampling ------------------------------------------------------------------------------------
    def active_knobs(self, partial: Mapping[str, object], workload: Workload) -> list[str]:
        """Knobs that apply given the engine and batching mode already chosen: the Candidate fields that a row
        of the key table (autotune/verl/keys.py) exports for this job; an unset gate allows either choice."""
        from autotune.verl.keys import active_knobs_for

        engine = partial.get("actor_engine") or "fsdp"
        dynamic = partial.get("use_dynamic_bsz")
        exported = active_knobs_for(workload, str(engine), None if dynamic is None else bool(dynamic))
        return [name for name in self.domains if name in ("actor_engine", "use_dynamic_bsz") or name in exported]

    def suggest(self, trial: optuna.Trial, workload: Workload) -> tuple[Candidate, Workload]:
        values: dict[str, object] = {}
        for gate in ("actor_engine", "use_dynamic_bsz"):
            values[gate] = self._pick(trial, gate)
        for name in self.active_knobs(values, workload):
            if name not in values:
                values[name] = self._pick(trial, name)
        if values.get("actor_engine") != "megatron":
            values["cuda_device_max_connections"] = 0
        wl_changes = {name: dom.suggest(trial, f"workload.{name}") for name, dom in self.workload_domains.items()}
        return Candidate(**values), (_replace(workload, wl_changes) if wl_changes else workload)

    def _pick(self, trial: optuna.Trial, name: str):
        if name in self.fixed:
            return self.fixed[name]
        return self.domains[name].suggest(trial, name)

    def params_of(self, candidate: Candidate, workload: Workload) -> dict:
        """The Optuna params a candidate corresponds to (for enqueueing a known point)."""
        values = candidate.as_params()
        partial = {"actor_engine": values["actor_engine"], "use_dynamic_bsz": values["use_dynamic_bsz"]}
        names = ["actor_engine", "use_dynamic_bsz"] + self.active_knobs(partial, workload)
        params = {n: values[n] for n in dict.fromkeys(names) if n not in self.fixed}
        for name in self.workload_domains:
            params[f"workload.{name}"] = getattr(workload, name)
        return params

    def contains(self, params: Mapping[str, object]) -> bool:
        for name, value in params.items():
            dom = self.workload_domains.get(name.removeprefix("workload.")) if name.startswith("workload.") \
                else self.domains.get(name)
            if dom is None or not dom.contains(value):
                return False
        return True


def _replace(workload: Workload, changes: dict) -> Workload:
    from dataclasses import replace
    return replace(workload, **changes)


def _divisors_pow2_or_all(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (d & (d - 1) == 0 or d % 8 == 0)]


_KNOB_TYPES = {f.name: f.type for f in fields(Candidate)}


def _check_type(name: str, value) -> None:
    expected = _KNOB_TYPES[name]
    ok = {"bool": isinstance(value, bool), "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str)}[expected]
    if not ok:
        raise ConfigError(f"tune.yaml: knob {name} must be {expected}, but got {name}={value!r}")


def _check_engine_pins(fixed: dict) -> None:
    """A pinned engine-specific knob (other than its neutral value) needs its engine pinned too."""
    engine = fixed.get("actor_engine")
    for name, value in fixed.items():
        neutral = value in (1, False, 0) and not (isinstance(value, float))
        if name == "cuda_device_max_connections":
            continue  # an environment variable: pinned, it applies to the Megatron trials only
        if name in MEGATRON_ONLY and not neutral and engine != "megatron":
            raise ConfigError(f"tune.yaml fixed: {name} applies to the Megatron engine only; also pin "
                              "actor_engine: megatron")
        if name in FSDP_ONLY and not neutral and engine not in ("fsdp", "fsdp2"):
            raise ConfigError(f"tune.yaml fixed: {name} applies to the FSDP engines only; also pin actor_engine: "
                              "fsdp or fsdp2")


def _held(domain: Domain, pinned, hold) -> Domain:
    """A domain narrowed to the values the user's job holds it at (the engines it may run on, its rollout TP); a
    pin or range outside them is one clear error. A single held value is the user's own and always kept."""
    if pinned is not None and pinned not in hold.values:
        raise ConfigError(f"tune.yaml fixed: {hold.knob}={pinned!r}, but {hold.describe()}")
    kept = tuple(v for v in domain.choices if v in hold.values) or (hold.values if len(hold.values) == 1 else ())
    if not kept:
        raise ConfigError(f"no {hold.knob} left to search (allowed here: {domain.describe()}), since {hold.describe()}")
    return Domain(choices=kept)


def _narrow(name: str, domain: Domain, spec, *, structural: bool = False) -> Domain:
    """Apply a tune.yaml range: a list of choices, or {low, high} for a numeric knob.

    Structural knobs (parallel sizes, engine) only accept values that can be valid for this model and GPU
    count; other knobs may be extended beyond the default list (e.g. max_num_seqs: [2048]).
    """
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"tune.yaml ranges.{name}: the list of choices is empty")
        if any(isinstance(v, float) and not math.isfinite(v) for v in spec):
            raise ConfigError(f"tune.yaml ranges.{name}: choices must be finite numbers, but got {spec!r}")
        for value in spec:
            if name in _KNOB_TYPES:
                _check_type(name, value)
        if structural:
            bad = [v for v in spec if not domain.contains(v)]
            if bad:
                raise ConfigError(f"tune.yaml ranges.{name}: {bad} can never be valid here (valid: "
                                  f"{domain.describe()})")
        if domain.choices:
            return Domain(choices=tuple(spec))
        bad = [v for v in spec if not domain.contains(v)]
        if bad:
            raise ConfigError(f"tune.yaml ranges.{name}: {bad} outside {domain.describe()}")
        return Domain(choices=tuple(spec))
    if isinstance(spec, dict) and set(spec) <= {"low", "high", "step"} and {"low", "high"} <= set(spec):
        low, high = spec["low"], spec["high"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)) \
                or low > high:
            raise ConfigError(f"tune.yaml ranges.{name}: need numbers with low <= high, but got {spec!r}")
        if domain.choices:
            kept = tuple(c for c in domain.choices if isinstance(c, (int, float)) and low <= c <= high)
            if not kept:
                raise ConfigError(f"tune.yaml ranges.{name}: no valid value in [{low}, {high}]; valid: {domain.describe()}")
            return Domain(choices=kept)
        if low < domain.low - 1e-9 or high > domain.high + 1e-9:
            raise ConfigError(f"tune.yaml ranges.{name}: [{low}, {high}] is outside the valid {domain.describe()}")
        step = spec.get("step", domain.step)
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not 0 < step < math.inf:
            raise ConfigError(f"tune.yaml ranges.{name}: step must be a positive number, but got step={step!r}")
        return Domain(low=float(low), high=float(high), step=float(step))
    raise ConfigError(f"tune.yaml ranges.{name}: expected a list of values or {{low: .., high: ..}}, but got {spec!r}")


def default_domains(model: ModelSpec, workload: Workload, *, world: int, gpus_per_node: int) -> dict[str, Domain]:
    """Every knob with the values that can be valid for this model, world size and workload."""
    node = min(gpus_per_node, world)
    tp_ok = [t for t in _divisors_pow2(world, node) if model.num_heads % t == 0 and model.num_kv_heads % t == 0]
    pp_ok = [p for p in range(1, world + 1) if world % p == 0 and model.num_layers % p == 0 and p <= 16]
    vpp_ok = [v for v in (1, 2, 3, 4) if v == 1 or any(p > 1 and (model.num_layers // p) % v == 0 for p in pp_ok)]
    cp_ok = [c for c in _divisors_pow2(world, node) if c <= 8]
    sp_ok = [s for s in _divisors_pow2(world, node)
             if model.num_heads % s == 0 and (model.num_kv_heads % s == 0 or s % model.num_kv_heads == 0)]
    rollout_tp_ok = [t for t in _divisors_pow2(world) if model.num_heads % t == 0 and (t % node == 0 or node % t == 0)]
    mini_per_rank_max = max(workload.trajectories_per_mini_batch // max(world // max(sp_ok + tp_ok), 1), 1)
    full_per_rank_max = max(workload.trajectories_per_step // max(world // max(sp_ok + tp_ok), 1), 1)
    micro_ok = [m for m in _pow2_upto(min(mini_per_rank_max, 64))]
    lp_micro_ok = [m for m in _pow2_upto(min(full_per_rank_max, 128))]
    seq = workload.seq_len
    budgets = sorted({seq * k for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if seq * k <= 262144} | {seq})
    domains: dict[str, Domain] = {
        "actor_engine": Domain(choices=ENGINES),
        "actor_tp": Domain(choices=tuple(tp_ok)),
        "actor_pp": Domain(choices=tuple(pp_ok)),
        "actor_vpp": Domain(choices=tuple(vpp_ok)),
        "actor_cp": Domain(choices=tuple(cp_ok)),
        "ulysses_sp": Domain(choices=tuple(sp_ok)),
        "rollout_tp": Domain(choices=tuple(rollout_tp_ok)),
        "gpu_memory_utilization": Domain(low=0.3, high=0.9, step=0.05),
        "max_num_seqs": Domain(choices=(64, 128, 256, 512, 1024)),
        "max_num_batched_tokens": Domain(choices=tuple(sorted({4096, 8192, 16384, 32768} | {max(seq, 4096)}))),
        "enable_chunked_prefill": Domain(choices=(True, False)),
        "use_dynamic_bsz": Domain(choices=(False, True)),
        "ppo_micro_batch_size_per_gpu": Domain(choices=tuple(micro_ok)),
        "log_prob_micro_batch_size_per_gpu": Domain(choices=tuple(lp_micro_ok)),
        "ref_log_prob_micro_batch_size_per_gpu": Domain(choices=tuple(lp_micro_ok)),
        "ppo_max_token_len_per_gpu": Domain(choices=tuple(budgets)),
        "log_prob_max_token_len_per_gpu": Domain(choices=tuple(budgets)),
        "gradient_checkpointing": Domain(choices=(True, False)),
        "activation_offload": Domain(choices=(False, True)),
        "param_offload": Domain(choices=(False, True)),
        "optimizer_offload": Domain(choices=(False, True)),
        "ref_param_offload": Domain(choices=(False, True)),
        "use_remove_padding": Domain(choices=(True, False)),
        "use_torch_compile": Domain(choices=(True, False)),
        "use_liger": Domain(choices=(False, True)),
        "use_fused_kernels": Domain(choices=(False, True)),
        "cuda_device_max_connections": Domain(choices=(1, 8)),
    }
    if model.is_moe:
        domains["actor_ep"] = Domain(choices=tuple(e for e in _divisors_pow2(world) if model.num_experts % e == 0))
        domains["actor_etp"] = Domain(choices=tuple(tp_ok))
    return domains


def verl_default_candidate(model: ModelSpec, workload: Workload, *, gpus_per_node: int, nodes: int) -> Candidate:
    """verl 0.9.1's defaults for what a user leaves unset, plus the quickstart's micro-batch sizes.

    rollout TP 2 (rollout.yaml:64), gpu_memory_utilization 0.5 (:46), max_num_seqs 256 (:84),
    max_num_batched_tokens 8192 (:78), chunked prefill on (:87), gradient checkpointing on and
    remove-padding on (hf_model.yaml:34,40), FSDP (dp_actor.yaml:26), no offload. verl leaves the
    micro-batch sizes unset (null) and refuses to start without them; the quickstart and the GRPO
    examples use 4 for training and 8 for log-prob passes (docs/start/quickstart.rst), shrunk to the
    largest power of two that divides the per-rank batch when those do not.
    """
    world = gpus_per_node * nodes
    rollout_tp = 2 if (model.num_heads % 2 == 0 and world % 2 == 0) else 1
    per_rank_mini = max(workload.trajectories_per_mini_batch // world, 1)
    per_rank_full = max(workload.trajectories_per_step // world, 1)

    def fit(preferred: int, per_rank: int) -> int:
        value = preferred
        while value > 1 and per_rank % value:
            value //= 2
        return value

    lp = fit(8, per_rank_full)
    return Candidate(actor_engine="fsdp", rollout_tp=rollout_tp, gpu_memory_utilization=0.5, max_num_seqs=256,
                     max_num_batched_tokens=8192, enable_chunked_prefill=True, use_dynamic_bsz=False,
                     ppo_micro_batch_size_per_gpu=fit(4, per_rank_mini), log_prob_micro_batch_size_per_gpu=lp,
                     ref_log_prob_micro_batch_size_per_gpu=lp, gradient_checkpointing=True,
                     use_remove_padding=True, use_torch_compile=True)
