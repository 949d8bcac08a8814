"""The GRPO search space (autotune/spaces/space.py): domains, tune.yaml validation, conditional sampling.

Sampling runs on real Optuna trials (RandomSampler with a seed where many trials are drawn, so the
tests are fast and repeatable).
"""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.models import MODELS, get_model
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import RULES, CheckContext
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import (DYNAMIC_ONLY, FSDP_ONLY, MEGATRON_ONLY, REF_ONLY, STATIC_ONLY, Domain,
                                   SearchSpace, default_domains, verl_default_candidate)
from autotune.workload import Workload

optuna.logging.set_verbosity(optuna.logging.WARNING)

WL = Workload()
Q7B = get_model("qwen2.5-7b")
MOE = get_model("qwen3-30b-a3b")
# (gpus_per_node, nodes): one node, multi-node, and a 6-GPU node shape whose world is not a power of two
WORLDS = [(8, 1), (8, 2), (8, 4), (6, 2), (4, 1)]
RULE = {fn.__name__: fn for fn in RULES}


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def rule_ok(rule: str, model, cand: Candidate, *, gpus_per_node: int, nodes: int, workload: Workload = WL) -> bool:
    layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    return RULE[rule](CheckContext(model=model, workload=workload, candidate=cand, layout=layout)) is None


def random_study(seed: int = 0) -> optuna.Study:
    return optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))


def sample(space: SearchSpace, n: int, workload: Workload = WL, seed: int = 0):
    study = random_study(seed)
    out = []
    for _ in range(n):
        trial = study.ask()
        cand, wl = space.suggest(trial, workload)
        out.append((trial, cand, wl))
    return out


# ---- domains -------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_parallel_domains_hold_only_valid_values(model_name):
    model = MODELS[model_name]
    for per_node, nodes in WORLDS:
        world, node = per_node * nodes, min(per_node, per_node * nodes)
        dom = default_domains(model, WL, world=world, gpus_per_node=per_node)
        where = f"{model_name} on {per_node}x{nodes}"
        assert 1 in dom["rollout_tp"].choices, where
        for tp in dom["rollout_tp"].choices:
            assert is_pow2(tp) and world % tp == 0 and model.num_heads % tp == 0, (where, tp)
            assert tp % node == 0 or node % tp == 0, (where, tp)
        for tp in dom["actor_tp"].choices:
            assert model.num_heads % tp == 0 and model.num_kv_heads % tp == 0 and world % tp == 0, (where, tp)
            assert tp <= node, (where, tp)  # Megatron TP stays inside a node
        for pp in dom["actor_pp"].choices:
            assert model.num_layers % pp == 0 and world % pp == 0, (where, pp)
        for sp in dom["ulysses_sp"].choices:
            assert world % sp == 0 and model.num_heads % sp == 0, (where, sp)
            assert model.num_kv_heads % sp == 0 or sp % model.num_kv_heads == 0, (where, sp)
        for cp in dom["actor_cp"].choices:
            assert world % cp == 0, (where, cp)
        for vpp in dom["actor_vpp"].choices:
            assert vpp == 1 or any(pp > 1 and (model.num_layers // pp) % vpp == 0 for pp in dom["actor_pp"].choices)
        if model.is_moe:
            for ep in dom["actor_ep"].choices:
                assert model.num_experts % ep == 0 and world % ep == 0, (where, ep)
        else:
            assert "actor_ep" not in dom and "actor_etp" not in dom, where


@pytest.mark.parametrize("model_name", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-30b-a3b", "llama-3.1-70b"])
@pytest.mark.parametrize("per_node, nodes", WORLDS)
def test_every_parallel_choice_passes_its_rules(model_name, per_node, nodes):
    """Each domain value, alone on top of the defaults, passes the rules that govern that knob."""
    model = MODELS[model_name]
    dom = default_domains(model, WL, world=per_node * nodes, gpus_per_node=per_node)
    kw = dict(gpus_per_node=per_node, nodes=nodes)
    megatron = Candidate(actor_engine="megatron", cuda_device_max_connections=1)
    for tp in dom["rollout_tp"].choices:
        cand = Candidate(rollout_tp=tp)
        for rule in ("vllm_heads_divisible_by_tp", "rollout_world_divisible", "rollout_replica_spans_whole_nodes"):
            assert rule_ok(rule, model, cand, **kw), (rule, tp)
    for tp in dom["actor_tp"].choices:
        cand = megatron.with_(actor_tp=tp)
        for rule in ("megatron_heads_divisible_by_tp", "megatron_kv_heads_divisible_by_tp",
                     "world_divisible_by_model_parallel"):
            assert rule_ok(rule, model, cand, **kw), (rule, tp)
    for pp in dom["actor_pp"].choices:
        cand = megatron.with_(actor_pp=pp)
        for rule in ("megatron_layers_divisible_by_pp", "world_divisible_by_model_parallel"):
            assert rule_ok(rule, model, cand, **kw), (rule, pp)
    for sp in dom["ulysses_sp"].choices:
        cand = Candidate(ulysses_sp=sp)
        for rule in ("ulysses_heads_divisible", "world_divisible_by_ulysses"):
            assert rule_ok(rule, model, cand, **kw), (rule, sp)
    for ep in dom.get("actor_ep", Domain()).choices:
        assert rule_ok("megatron_experts_divisible_by_ep", model, megatron.with_(actor_ep=ep), **kw), ep
        assert rule_ok("megatron_expert_group_fits", model, megatron.with_(actor_ep=ep), **kw), ep


def test_qwen25_7b_domains_on_one_node():
    dom = default_domains(Q7B, WL, world=8, gpus_per_node=8)
    assert dom["rollout_tp"].choices == (1, 2, 4)  # 28 heads rule out vLLM TP 8
    assert dom["actor_tp"].choices == (1, 2, 4)  # 4 KV heads cap Megatron TP at 4
    assert dom["ulysses_sp"].choices == (1, 2, 4)
    assert dom["actor_pp"].choices == (1, 2, 4)  # 28 layers: no PP 8
    assert dom["actor_engine"].choices == ("fsdp", "fsdp2", "megatron")


def test_qwen25_0_5b_has_only_tp_1_and_2():
    dom = default_domains(get_model("qwen2.5-0.5b"), WL, world=8, gpus_per_node=8)
    assert dom["rollout_tp"].choices == (1, 2)  # 14 heads
    assert dom["actor_tp"].choices == (1, 2)


def test_pp_3_offered_only_when_layers_and_world_allow():
    # 12 GPUs: qwen2.5-3b has 36 layers (PP 3 fits); qwen2.5-7b has 28 (it does not)
    assert 3 in default_domains(get_model("qwen2.5-3b"), WL, world=12, gpus_per_node=6)["actor_pp"].choices
    assert 3 not in default_domains(Q7B, WL, world=12, gpus_per_node=6)["actor_pp"].choices
    assert 3 not in default_domains(get_model("qwen2.5-3b"), WL, world=8, gpus_per_node=8)["actor_pp"].choices


def test_token_budgets_cover_one_sequence():
    dom = default_domains(Q7B, WL, world=8, gpus_per_node=8)
    for knob in DYNAMIC_ONLY:
        assert min(dom[knob].choices) == WL.seq_len  # verl's floor: budget >= prompt + response
    assert all(t >= WL.seq_len for t in dom["max_num_batched_tokens"].choices)
    long_wl = Workload(max_prompt_length=2048, max_response_length=8192)
    dom = default_domains(Q7B, long_wl, world=8, gpus_per_node=8)
    assert long_wl.seq_len in dom["max_num_batched_tokens"].choices


# ---- build: tune.yaml validation -------------------------------------------------------------------

def build(**kw) -> SearchSpace:
    return SearchSpace.build(kw.pop("model", Q7B), kw.pop("workload", WL), gpus_per_node=8, nodes=1, **kw)


@pytest.mark.parametrize("kwargs, names", [
    (dict(fixed={"actor_tpp": 2}), "actor_tpp"),
    (dict(fixed={"actor_ep": 2}), "actor_ep"),  # dense model: no expert-parallel knob
    (dict(fixed={"actor_tp": "2"}), "actor_tp"),
    (dict(fixed={"ppo_micro_batch_size_per_gpu": True}), "ppo_micro_batch_size_per_gpu"),
    (dict(fixed={"gradient_checkpointing": "yes"}), "gradient_checkpointing"),
    (dict(fixed={"gpu_memory_utilization": "0.5"}), "gpu_memory_utilization"),
    (dict(ranges={"max_seqs": [64]}), "max_seqs"),
    (dict(ranges={"rollout_tp": []}), "rollout_tp"),
    (dict(ranges={"max_num_seqs": {"low": 5, "high": 1}}), "max_num_seqs"),
    (dict(ranges={"gpu_memory_utilization": {"low": 0.8, "high": 0.4}}), "gpu_memory_utilization"),
    (dict(ranges={"rollout_tp": {"low": 3, "high": 3}}), "rollout_tp"),  # no valid value in the range
    (dict(ranges={"gpu_memory_utilization": [0.5, 0.95]}), "gpu_memory_utilization"),  # outside 0.3..0.9
    (dict(ranges={"actor_tp": ["2"]}), "actor_tp"),
    (dict(ranges={"rollout_tp": 2}), "rollout_tp"),
    (dict(ranges={"rollout_tp": {"low": 1}}), "rollout_tp"),
    (dict(tune_workload=["rollout_n"]), "rollout_n"),
    (dict(tune_workload=["learning_rate"]), "learning_rate"),
])
def test_build_rejects_bad_input_naming_the_knob(kwargs, names):
    with pytest.raises(ConfigError, match=names):
        build(**kwargs)


def test_fixed_int_is_accepted_for_a_float_knob():
    space = build(fixed={"gpu_memory_utilization": 1})
    assert space.fixed == {"gpu_memory_utilization": 1}


def test_range_list_replaces_choices():
    space = build(ranges={"rollout_tp": [1, 2], "ppo_micro_batch_size_per_gpu": [2, 4, 8]})
    assert space.domains["rollout_tp"].choices == (1, 2)
    assert space.domains["ppo_micro_batch_size_per_gpu"].choices == (2, 4, 8)
    untouched = default_domains(Q7B, WL, world=8, gpus_per_node=8)
    assert space.domains["max_num_seqs"] == untouched["max_num_seqs"]


def test_range_low_high_keeps_the_valid_choices_inside():
    space = build(ranges={"ppo_micro_batch_size_per_gpu": {"low": 2, "high": 8}, "rollout_tp": {"low": 2, "high": 8}})
    assert space.domains["ppo_micro_batch_size_per_gpu"].choices == (2, 4, 8)
    assert space.domains["rollout_tp"].choices == (2, 4)  # 8 is not valid for 28 heads


def test_float_range_is_narrowed_and_sampled_inside():
    space = build(ranges={"gpu_memory_utilization": {"low": 0.4, "high": 0.6}})
    dom = space.domains["gpu_memory_utilization"]
    assert (dom.low, dom.high, dom.step) == (0.4, 0.6, 0.05)
    values = {round(c.gpu_memory_utilization, 6) for _, c, _ in sample(space, 40)}
    assert values <= {0.4, 0.45, 0.5, 0.55, 0.6} and len(values) > 1


def test_float_range_list_becomes_choices():
    space = build(ranges={"gpu_memory_utilization": [0.5, 0.7]})
    assert space.domains["gpu_memory_utilization"].choices == (0.5, 0.7)


# ---- suggest: conditional knobs ----------------------------------------------------------------------

@pytest.mark.parametrize("model", [Q7B, MOE], ids=["dense", "moe"])
def test_megatron_knobs_only_under_megatron(model):
    space = SearchSpace.build(model, WL, gpus_per_node=8, nodes=1)
    megatron_knobs = set(MEGATRON_ONLY) & set(space.domains)
    seen = {"fsdp": 0, "fsdp2": 0, "megatron": 0}
    for trial, cand, _ in sample(space, 60):
        seen[cand.actor_engine] += 1
        assert trial.params["actor_engine"] == cand.actor_engine
        if cand.actor_engine in ("fsdp", "fsdp2"):
            assert not megatron_knobs & set(trial.params), trial.params
            assert (cand.actor_tp, cand.actor_pp, cand.actor_vpp, cand.actor_cp, cand.actor_ep, cand.actor_etp) == \
                (1, 1, 1, 1, 1, 1)
            assert cand.cuda_device_max_connections == 0
        else:
            assert megatron_knobs <= set(trial.params)
            assert not set(FSDP_ONLY) & set(trial.params)
            assert cand.ulysses_sp == 1 and cand.activation_offload is False and cand.use_liger is False
            assert cand.cuda_device_max_connections in (1, 8)
    assert all(seen.values()), seen


def test_batching_knobs_follow_use_dynamic_bsz():
    space = build()
    seen = {True: 0, False: 0}
    for trial, cand, _ in sample(space, 40, seed=1):
        seen[cand.use_dynamic_bsz] += 1
        params = set(trial.params)
        if cand.use_dynamic_bsz:
            assert not set(STATIC_ONLY) & params
            assert set(DYNAMIC_ONLY) <= params
        else:
            assert not set(DYNAMIC_ONLY) & params
            assert set(STATIC_ONLY) <= params
    assert all(seen.values()), seen


def test_ref_knobs_absent_without_kl_loss():
    wl = Workload(use_kl_loss=False)
    space = SearchSpace.build(Q7B, wl, gpus_per_node=8, nodes=1)
    for trial, cand, _ in sample(space, 20, workload=wl):
        assert not set(REF_ONLY) & set(trial.params)
        assert cand.ref_param_offload is False


def test_fixed_knobs_reach_the_candidate_but_not_the_params():
    fixed = {"gpu_memory_utilization": 0.7, "rollout_tp": 4, "use_dynamic_bsz": False, "actor_engine": "fsdp2"}
    space = build(fixed=fixed)
    for trial, cand, _ in sample(space, 10):
        assert not set(fixed) & set(trial.params)
        assert (cand.gpu_memory_utilization, cand.rollout_tp, cand.use_dynamic_bsz, cand.actor_engine) == \
            (0.7, 4, False, "fsdp2")
        assert "ppo_micro_batch_size_per_gpu" in trial.params  # static mode knobs still tuned


def test_sampled_values_stay_in_their_domains():
    space = SearchSpace.build(MOE, WL, gpus_per_node=8, nodes=2)
    for trial, cand, _ in sample(space, 30, seed=3):
        assert space.contains(trial.params), trial.params
        for name, value in trial.params.items():
            assert getattr(cand, name) == value


def test_tune_workload_adds_a_mini_batch_param():
    space = build(tune_workload=["ppo_mini_batch_size"])
    dom = space.workload_domains["ppo_mini_batch_size"]
    for mini in dom.choices:
        assert WL.train_batch_size % mini == 0
        assert mini * WL.rollout_n % 8 == 0 or mini == WL.ppo_mini_batch_size
    study = random_study()
    study.enqueue_trial({"workload.ppo_mini_batch_size": 128})
    trial = study.ask()
    _, wl = space.suggest(trial, WL)
    assert trial.params["workload.ppo_mini_batch_size"] == 128
    assert wl.ppo_mini_batch_size == 128 and wl.train_batch_size == WL.train_batch_size
    assert WL.ppo_mini_batch_size == 256  # the user's workload object is untouched


def test_tune_workload_respects_a_range():
    space = build(tune_workload=["ppo_mini_batch_size"], ranges={"ppo_mini_batch_size": [64, 128]})
    assert space.workload_domains["ppo_mini_batch_size"].choices == (64, 128)
    assert "ppo_mini_batch_size" not in space.domains
    minis = {wl.ppo_mini_batch_size for _, _, wl in sample(space, 20)}
    assert minis == {64, 128}


def test_without_tune_workload_the_workload_is_returned_as_is():
    for trial, _, wl in sample(build(), 5):
        assert wl is WL
        assert not any(name.startswith("workload.") for name in trial.params)


# ---- params_of / contains / enqueue -----------------------------------------------------------------

@pytest.mark.parametrize("model_name", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-30b-a3b", "qwen2.5-72b"])
@pytest.mark.parametrize("per_node, nodes", [(8, 1), (8, 2), (8, 4)])
def test_verl_default_is_in_the_space_and_replays(model_name, per_node, nodes):
    model = MODELS[model_name]
    space = SearchSpace.build(model, WL, gpus_per_node=per_node, nodes=nodes)
    default = verl_default_candidate(model, WL, gpus_per_node=per_node, nodes=nodes)
    params = space.params_of(default, WL)
    assert space.contains(params)
    assert not set(MEGATRON_ONLY) & set(params)
    study = optuna.create_study()
    study.enqueue_trial(params)
    trial = study.ask()
    cand, wl = space.suggest(trial, WL)
    assert cand == default
    assert wl == WL
    assert trial.params == params


def test_megatron_and_dynamic_candidates_replay():
    space = SearchSpace.build(MOE, WL, gpus_per_node=8, nodes=1)
    cand = Candidate(actor_engine="megatron", actor_tp=2, actor_pp=2, actor_vpp=2, actor_ep=4,
                     cuda_device_max_connections=1, use_dynamic_bsz=True,
                     ppo_max_token_len_per_gpu=WL.seq_len * 4, log_prob_max_token_len_per_gpu=WL.seq_len * 8)
    params = space.params_of(cand, WL)
    assert space.contains(params)
    assert not set(FSDP_ONLY) & set(params) and not set(STATIC_ONLY) & set(params)
    study = optuna.create_study()
    study.enqueue_trial(params)
    replayed, _ = space.suggest(study.ask(), WL)
    assert replayed == cand


def test_params_of_includes_tuned_workload_and_skips_fixed():
    space = build(fixed={"rollout_tp": 2}, tune_workload=["ppo_mini_batch_size"])
    wl = Workload(ppo_mini_batch_size=128)
    default = verl_default_candidate(Q7B, wl, gpus_per_node=8, nodes=1)
    params = space.params_of(default, wl)
    assert "rollout_tp" not in params
    assert params["workload.ppo_mini_batch_size"] == 128
    assert space.contains(params)
    study = optuna.create_study()
    study.enqueue_trial(params)
    cand, replayed_wl = space.suggest(study.ask(), WL)
    assert cand == default and replayed_wl == wl


def test_contains_rejects_values_and_names_outside_the_space():
    space = build()
    assert not space.contains({"rollout_tp": 8})  # 28 heads
    assert not space.contains({"gpu_memory_utilization": 0.95})
    assert not space.contains({"no_such_knob": 1})
    assert not space.contains({"workload.ppo_mini_batch_size": 128})  # workload not opted in
    assert space.contains({"rollout_tp": 4, "gpu_memory_utilization": 0.9})


# ---- input validation gaps (reported as bugs) -----------------------------------------------------------

@pytest.mark.parametrize("step", ["fine", 0, -0.05])
def test_range_step_must_be_a_positive_number(step):
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        build(ranges={"gpu_memory_utilization": {"low": 0.4, "high": 0.6, "step": step}})


def test_float_range_outside_the_domain_is_rejected():
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        build(ranges={"gpu_memory_utilization": {"low": 0.5, "high": 1.5}})


def test_choice_list_with_only_invalid_values_is_rejected():
    with pytest.raises(ConfigError, match="rollout_tp"):
        build(ranges={"rollout_tp": [8]})
