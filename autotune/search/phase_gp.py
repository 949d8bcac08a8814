"""One GRPO phase's learned correction: a Gaussian process of log(measured / predicted) over the knobs that drive the
phase (issue 19; the search that uses it is search/learned.py).

The kernel is additive, one exact-match term per group of knobs (every candidate; same rollout TP; same actor layout;
same layout and micro-batching; each memory saver or kernel flag alone, across layouts; ...), each with its own prior
scale; the flag terms' scale is picked per phase by the marginal likelihood. A probe therefore corrects the phase for
every untried candidate that shares a group with it, and most for those that share the finest groups; a candidate
that shares nothing keeps the prior uncertainty. This is GP regression with a sum of categorical (Hamming-type)
kernels, as BoTorch's mixed kernels use for categorical inputs, kept to numpy and a few dozen observations.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping

import numpy as np

from autotune.search.equivalence import LAYOUT, ROLLOUT_SETTING

ROLLOUT = ("rollout_tp", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill")
SCHEDULER = ("rollout_tp", "max_num_seqs", "enable_chunked_prefill", "max_num_batched_tokens")
TRAIN_FLAGS = ("gradient_checkpointing", "activation_offload", "param_offload", "optimizer_offload", "use_liger",
               "use_fused_kernels", "use_remove_padding", "use_torch_compile", "cuda_device_max_connections")
UPDATE_MICRO = ("use_dynamic_bsz", "ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu")
OLD_MICRO = ("use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu")
REF_MICRO = ("use_dynamic_bsz", "ref_log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu",
             "ref_param_offload")

# Prior standard deviation of log(measured / predicted) explained by each group. The whole-phase term is wide:
# generation on a real verl run was 5x slower than predicted (log 5 = 1.6). The group terms are about the
# size of the sim's per-trial phase errors against the torch probe (update_actor -1% to -35%,
# benchmarks/results/sim_vs_torch_probe.txt), split over coarse and fine groups. For generation most of it
# sits on the vLLM setting itself (TP, batch and chunking) and less on the rollout TP it shares with others: a
# wide TP term let one probe of a TP 2 setting that ran slow mark down every TP 2 setting, and on 32B development
# machine 29 that kept the optimum's rollout setting, the model's third, from a probe until probe 19 (round 6,
# benchmarks/results/search_efficiency.md). The engine keeps its shared term: narrowing it cost the fast-engine
# truth two probes (FSDP layouts were tried before Megatron TP 1).
WHOLE_PHASE = 0.8
_FLAG = 0.07  # per flag, shared by every layout: the largest prior scale; each phase picks its own (FLAG_SCALES)
FLAG_SCALES = (0.0, 0.035, _FLAG)


def _train_levels(micro: tuple) -> tuple:
    # the layout carries most of the prior: within a measured layout the model's own structure (micro-batch
    # size, savers) is trusted more, so exploring spends probes on untried layouts, not on re-tries of one
    # each flag also has a term of its own across layouts: a flag's error is mostly the flag's (fused kernels ran the
    # H200 job's log-prob passes x2.5 faster, benchmarks/verl_h200/README.md: one configuration, but the per-token loop
    # they skip costs the same per token in any layout), so a probe with it on in one layout corrects it in the others
    return ((((), WHOLE_PHASE), (("actor_engine",), 0.15), (LAYOUT, 0.15), (micro, 0.05), (LAYOUT + micro, 0.05),
             (LAYOUT + TRAIN_FLAGS, 0.05), (LAYOUT + TRAIN_FLAGS + micro, 0.03))
            + tuple(((flag,), _FLAG) for flag in TRAIN_FLAGS))


PHASE_LEVELS: dict[str, tuple] = {
    # vLLM's scheduler setting (TP, batch, chunking, token budget) vs the memory share, which only sets KV room
    "gen": (((), WHOLE_PHASE), (("rollout_tp",), 0.1), (("rollout_tp", "enable_chunked_prefill"), 0.07),
            (("rollout_tp", "max_num_seqs"), 0.07), (ROLLOUT_SETTING, 0.18), (SCHEDULER, 0.05),
            (("rollout_tp", "gpu_memory_utilization"), 0.05), (ROLLOUT, 0.03)),
    "update_actor": _train_levels(UPDATE_MICRO),
    "old_log_prob": _train_levels(OLD_MICRO),
    "ref": _train_levels(REF_MICRO),
    "update_weights": (((), WHOLE_PHASE), (("rollout_tp",), 0.15), (("rollout_tp", "param_offload") + LAYOUT, 0.1)),
}
DEFAULT_LEVELS = (((), WHOLE_PHASE), (LAYOUT, 0.15), (ROLLOUT, 0.15))
NOISE_REL = 0.05  # run-to-run spread of a phase's median time (the sim plays 3% per step)


class PhaseGP:
    """GP regression of one phase's log residual on exact-match group kernels."""

    def __init__(self, levels: tuple, keys: list[dict], y: np.ndarray, noise_rel: float = NOISE_REL) -> None:
        self.levels = levels
        self.n = len(y)
        self.var0 = sum(s * s for _, s in levels)
        self.index: list[dict] = []
        self.getters = [_getter(knobs) for knobs, _ in levels]
        K = np.zeros((self.n, self.n))
        for (knobs, scale), get in zip(levels, self.getters):
            groups: dict = {}
            for i, params in enumerate(keys):
                groups.setdefault(get(params), []).append(i)
            self.index.append({g: np.array(ix) for g, ix in groups.items()})
            for ix in groups.values():
                K[np.ix_(ix, ix)] += scale * scale
        K[np.diag_indices(self.n)] += noise_rel ** 2
        self.K, self.y = K, y  # the residuals' prior covariance (noise included) and the residuals
        self.K_inv = np.linalg.inv(K)
        self.alpha = self.K_inv @ y

    @functools.cached_property
    def log_evidence(self) -> float:
        """Log marginal likelihood up to its constant: how well these prior scales explain the residuals (only the
        phases with per-flag terms ask, best_evidence_gp)."""
        return -0.5 * float(self.y @ self.alpha) - 0.5 * float(np.linalg.slogdet(self.K)[1])

    def predict(self, params: Mapping) -> tuple[float, float]:
        """(posterior mean, posterior variance) of log(measured / predicted) for this candidate."""
        k = np.zeros(self.n)
        for (knobs, scale), index, get in zip(self.levels, self.index, self.getters):
            ix = index.get(get(params))
            if ix is not None:
                k[ix] += scale * scale
        mean = float(k @ self.alpha)
        var = max(self.var0 - float(k @ self.K_inv @ k), 1e-6)
        return mean, var


def _with_flag_scale(levels: tuple, scale: float) -> tuple:
    """These levels with each per-flag term at this prior scale (none at 0)."""
    return tuple((knobs, scale if _is_flag_term(knobs) else s) for knobs, s in levels
                 if not (_is_flag_term(knobs) and scale == 0))


def _is_flag_term(knobs: tuple) -> bool:
    return len(knobs) == 1 and knobs[0] in TRAIN_FLAGS


def best_evidence_gp(levels: tuple, keys: list[dict], y: np.ndarray, noise_rel: float) -> PhaseGP:
    """The phase's GP with the per-flag terms' prior scale that best explains its residuals (type-II maximum
    likelihood over FLAG_SCALES): where flags err alike in every layout the probes say so and the terms carry it to
    untried layouts; where they do not, the terms drop out instead of absorbing a probe's noise (on the search
    benchmark's layout truth, with a fixed 0.07, the export's regret after 40 noisy probes went 2.9% -> 4.7%)."""
    if not any(_is_flag_term(knobs) for knobs, _ in levels):
        return PhaseGP(levels, keys, y, noise_rel)
    return max((PhaseGP(_with_flag_scale(levels, scale), keys, y, noise_rel) for scale in FLAG_SCALES),
               key=lambda gp: gp.log_evidence)


def couple_probes(gps: Mapping[str, PhaseGP], probes: Mapping[str, list[int]], shared_var: float) -> None:
    """Condition the phases' GPs jointly on one more term: an effect shared by every phase of one probe, of variance
    `shared_var` (log time), beside each phase's own noise (the GPs' noise_rel).

    A probe's slow or fast launch moves all its phases alike (the same configuration on two H200s: gen x1.21,
    old_log_prob x1.30, ref x1.23, update_actor x1.47, benchmarks/results/sim_vs_verl_h200.txt; the search
    benchmark's per-probe noise is one such factor). Learned phase by phase, that factor is each phase's own residual
    and moves every configuration that shares a group with the probe. Jointly, the phases whose residual other probes
    already pin down (generation under a rollout setting probed before) tell the probe's factor, and it is taken out
    of the others: the linear-mixed-model reading of a random effect per probe (e.g. Rasmussen and Williams 2006,
    section 2.7). `probes[phase]` is the probe (or launch: whatever shares one effect) index of each of that GP's
    rows; each GP's posterior then keeps its own kernel, with the joint precision and weights in place of its own (a
    new configuration shares no probe). The GPs hold only their phase's own noise; with one phase measured, the
    shared term is that phase's other noise."""
    phases = [p for p in gps if gps[p].n]
    if shared_var <= 0:
        return
    offsets, total = {}, 0
    for p in phases:
        offsets[p], total = total, total + gps[p].n
    sigma = np.zeros((total, total))
    probe = np.empty(total, dtype=np.int64)
    y = np.empty(total)
    for p in phases:
        a, gp = offsets[p], gps[p]
        sigma[a:a + gp.n, a:a + gp.n] = gp.K
        probe[a:a + gp.n] = probes[p]
        y[a:a + gp.n] = gp.y
    sigma += shared_var * (probe[:, None] == probe[None, :])
    sigma_inv = np.linalg.inv(sigma)
    alpha = sigma_inv @ y
    for p in phases:
        a, gp = offsets[p], gps[p]
        gp.K_inv = sigma_inv[a:a + gp.n, a:a + gp.n]
        gp.alpha = alpha[a:a + gp.n]


def shared_effects(gps: Mapping[str, PhaseGP], probes: Mapping[str, list[int]], shared_var: float) -> dict[int, float]:
    """Each probe's (or launch's) shared effect in log time as couple_probes left the GPs conditioned: its posterior
    mean, shared_var times the sum of the joint weights over that probe's rows (the best linear unbiased predictor of
    a random effect, Robinson 1991). Empty where nothing is shared."""
    effects: dict[int, float] = {}
    if shared_var <= 0:
        return effects
    for phase, gp in gps.items():
        if not gp.n:
            continue
        for group, weight in zip(probes[phase], gp.alpha):
            effects[group] = effects.get(group, 0.0) + shared_var * float(weight)
    return effects


def _getter(knobs: tuple):
    """The group key of a candidate's canonical params (which hold every knob) for these knobs."""
    if not knobs:
        return lambda params: ()
    if len(knobs) == 1:
        get = operator.itemgetter(knobs[0])
        return lambda params: (get(params),)
    return operator.itemgetter(*knobs)
