"""verl 0.9.1's startup rules (autotune/verl/rules.py) against real model shapes.

Every rule in `constraints.RULES` has at least one case below: a candidate that breaks it (the rule
id appears, with verl's or the engine's own wording) and a close neighbour that differs in one knob
and passes it. Numbers come from ../shared/reference/verl.md section 2; model shapes from
autotune/models.py (qwen2.5-7b: 28 heads, 4 KV heads, 28 layers; qwen2.5-0.5b: 14 heads, 2 KV heads;
qwen3-30b-a3b: 128 experts, 32 heads, 4 KV heads, 48 layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from autotune.models import MODELS, get_model
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import RULES, CheckContext, Violation, check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import verl_default_candidate
from autotune.workload import Workload

ENFORCERS = {"verl", "vllm", "megatron-core", "autotune"}

FSDP = Candidate()  # verl's defaults: FSDP, rollout TP 2, micro 4, log-prob micro 8
MEGATRON = FSDP.with_(actor_engine="megatron", cuda_device_max_connections=1)
DEFAULT_WL = Workload()  # 1024 prompts x n=5, mini 256, prompt 512 + response 1024
# verl.md section 7's smallest probe: 64 prompts x n=5, mini 32, on 8 GPUs (per-rank mini 20, full 40)
PROBE_WL = Workload(train_batch_size=64, ppo_mini_batch_size=32)
# 96 x 5 = 480 trajectories divide 6, 12, 16 and 24 GPUs, for layouts that need an odd world size
WL_480 = Workload(train_batch_size=96, ppo_mini_batch_size=48)


@dataclass(frozen=True)
class Setup:
    model: str
    candidate: Candidate
    workload: Workload = DEFAULT_WL
    gpus_per_node: int = 8
    nodes: int = 1

    def layout(self) -> ParallelLayout:
        return ParallelLayout.of(self.candidate, self.workload, gpus_per_node=self.gpus_per_node, nodes=self.nodes)

    def context(self) -> CheckContext:
        return CheckContext(model=get_model(self.model), workload=self.workload, candidate=self.candidate,
                            layout=self.layout())

    def violations(self) -> dict[str, Violation]:
        found = check(get_model(self.model), self.workload, self.candidate, self.layout())
        return {v.rule: v for v in found}


@dataclass(frozen=True)
class Case:
    """One rule, a setup that breaks it, and a one-knob neighbour that passes it."""

    id: str
    rule: str
    bad: Setup
    good: Setup
    wording: str  # what verl or the engine prints (or autotune's own words, for autotune rules)
    only: bool = True  # the bad setup breaks this rule alone
    neighbour_clean: bool = True  # the neighbour passes every rule, not just this one
    extra: tuple[str, ...] = field(default=())  # other rules the bad setup also breaks, by design


CASES = [
    Case("megatron-tp2-pp2-cp4-on-8", "world_divisible_by_model_parallel",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=2, actor_pp=2, actor_cp=4)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=2, actor_pp=2, actor_cp=2)),
         "n_gpus (8) must be divisible by model_parallel_size (4) times context_parallel_size (4)"),
    Case("ulysses-4-on-6-gpus", "world_divisible_by_ulysses",
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=4), WL_480, gpus_per_node=6),
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=2), WL_480, gpus_per_node=6),
         "world size 6 is not divisible by ulysses_sequence_parallel_size 4"),
    # FSDP: minimal_bsz = n_gpus (verl/utils/config.py:118-127); 320 % 6 != 0, 384 % 6 == 0
    Case("fsdp-320-trajectories-on-6", "real_train_batch_divisible",
         Setup("qwen2.5-7b", FSDP, PROBE_WL, gpus_per_node=6),
         Setup("qwen2.5-7b", FSDP, Workload(train_batch_size=64, ppo_mini_batch_size=32, rollout_n=6),
               gpus_per_node=6),
         "real_train_batch_size (320) must be divisible by minimal possible batch size (6)",
         only=False, extra=("mini_batch_divisible_by_dp",)),
    # Megatron: minimal_bsz = dp * micro = 8 * 4; 48 x 5 = 240 is not a multiple of 32, but of 16
    Case("megatron-dp8-micro4-240-trajectories", "real_train_batch_divisible",
         Setup("qwen2.5-7b", MEGATRON.with_(log_prob_micro_batch_size_per_gpu=2, ref_log_prob_micro_batch_size_per_gpu=2),
               Workload(train_batch_size=48, ppo_mini_batch_size=32)),
         Setup("qwen2.5-7b", MEGATRON.with_(ppo_micro_batch_size_per_gpu=2, log_prob_micro_batch_size_per_gpu=2,
                                            ref_log_prob_micro_batch_size_per_gpu=2),
               Workload(train_batch_size=48, ppo_mini_batch_size=32)),
         "real_train_batch_size (240) must be divisible by minimal possible batch size (32)"),
    Case("mini-12-prompts-x5-on-8", "mini_batch_divisible_by_dp",
         Setup("qwen2.5-7b", FSDP.with_(ppo_micro_batch_size_per_gpu=2), Workload(train_batch_size=64, ppo_mini_batch_size=12)),
         Setup("qwen2.5-7b", FSDP.with_(ppo_micro_batch_size_per_gpu=2), Workload(train_batch_size=64, ppo_mini_batch_size=16)),
         "Got mini_batch_size=60 and dp_size=8"),
    # verl.md's worked example: mini 32 x 5 / 8 ranks = 20 per rank; micro 4 divides it, micro 3 does not
    Case("worked-example-micro-3", "micro_batch_divides_mini_batch",
         Setup("qwen2.5-7b", FSDP.with_(ppo_micro_batch_size_per_gpu=3), PROBE_WL),
         Setup("qwen2.5-7b", FSDP.with_(ppo_micro_batch_size_per_gpu=4), PROBE_WL),
         "20 % 3 != 0"),
    # per-rank full batch 64 x 5 / 8 = 40: log-prob micro 8 divides it, 16 does not
    Case("worked-example-rollout-log-prob-16", "rollout_log_prob_micro_divides_batch",
         Setup("qwen2.5-7b", FSDP.with_(log_prob_micro_batch_size_per_gpu=16), PROBE_WL),
         Setup("qwen2.5-7b", FSDP.with_(log_prob_micro_batch_size_per_gpu=8), PROBE_WL),
         "data size must be divisible by force_group_size * micro_batch_size_per_gpu"),
    Case("worked-example-ref-log-prob-16", "ref_log_prob_micro_divides_batch",
         Setup("qwen2.5-7b", FSDP.with_(ref_log_prob_micro_batch_size_per_gpu=16), PROBE_WL),
         Setup("qwen2.5-7b", FSDP.with_(ref_log_prob_micro_batch_size_per_gpu=8), PROBE_WL),
         "data size must be divisible by force_group_size * micro_batch_size_per_gpu"),
    Case("rollout-tp8-on-12-gpus", "rollout_world_divisible",
         Setup("qwen3-8b", FSDP.with_(rollout_tp=8), WL_480, gpus_per_node=4, nodes=3),
         Setup("qwen3-8b", FSDP.with_(rollout_tp=4), WL_480, gpus_per_node=4, nodes=3),
         "rollout world_size: 12 is not divisible by infer_world_size: 8"),
    # a replica bigger than a node must span whole nodes (workers/rollout/replica.py:107-116)
    Case("rollout-tp12-on-8-gpu-nodes", "rollout_replica_spans_whole_nodes",
         Setup("qwen2.5-1.5b", FSDP.with_(rollout_tp=12, ppo_micro_batch_size_per_gpu=2,
                                          log_prob_micro_batch_size_per_gpu=4, ref_log_prob_micro_batch_size_per_gpu=4),
               WL_480, nodes=3),
         Setup("qwen2.5-1.5b", FSDP.with_(rollout_tp=4, ppo_micro_batch_size_per_gpu=2,
                                          log_prob_micro_batch_size_per_gpu=4, ref_log_prob_micro_batch_size_per_gpu=4),
               WL_480, nodes=3),
         "world_size 12 must be divisible by gpus_per_node 8"),
    Case("qwen2.5-7b-rollout-tp8", "vllm_heads_divisible_by_tp",
         Setup("qwen2.5-7b", FSDP.with_(rollout_tp=8)),
         Setup("qwen2.5-7b", FSDP.with_(rollout_tp=4)),
         "Total number of attention heads (28) must be divisible by tensor parallel size (8)."),
    Case("qwen2.5-0.5b-rollout-tp4", "vllm_heads_divisible_by_tp",
         Setup("qwen2.5-0.5b", FSDP.with_(rollout_tp=4)),
         Setup("qwen2.5-0.5b", FSDP.with_(rollout_tp=2)),
         "Total number of attention heads (14) must be divisible by tensor parallel size (4)."),
    # heads are a multiple of KV heads, so a TP that breaks the head rule breaks the KV-head rule too
    Case("qwen2.5-7b-megatron-tp8-heads", "megatron_heads_divisible_by_tp",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=8)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=4)),
         "num_attention_heads (28) must be a multiple of tensor_model_parallel_size (8).",
         only=False, extra=("megatron_kv_heads_divisible_by_tp",)),
    Case("qwen2.5-7b-megatron-tp8-kv-heads", "megatron_kv_heads_divisible_by_tp",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=8)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=4)),
         "num_query_groups (4) must be a multiple of tensor_model_parallel_size (8).",
         only=False, extra=("megatron_heads_divisible_by_tp",)),
    # 32 heads divide TP 8 but 4 KV heads do not: the KV-head rule alone caps TP
    Case("qwen3-30b-a3b-megatron-tp8-kv-heads-only", "megatron_kv_heads_divisible_by_tp",
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_tp=8)),
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_tp=4)),
         "num_query_groups (4) must be a multiple of tensor_model_parallel_size (8)."),
    # 12 GPUs (2 nodes x 6) allow PP 3 arithmetically; 28 layers take an uneven split there (verl/pipeline_split.py),
    # which Megatron builds without virtual pipeline stages only
    Case("qwen2.5-7b-pp3-vpp2-on-12-gpus", "megatron_layers_divisible_by_pp",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=3, actor_vpp=2), WL_480, gpus_per_node=6, nodes=2),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=3), WL_480, gpus_per_node=6, nodes=2),
         "num_layers should be divisible by pipeline_model_parallel_size", only=False, extra=("megatron_vpp_layout",)),
    Case("vpp-without-pp", "megatron_vpp_layout",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_vpp=2)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_vpp=2, actor_pp=2)),
         "virtual_pipeline_model_parallel_size (2) needs pipeline_model_parallel_size > 1"),
    Case("vpp4-with-14-layers-per-stage", "megatron_vpp_layout",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=4)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2)),
         "layers per pipeline rank (14) must be divisible by virtual_pipeline_model_parallel_size (4)"),
    # PP 2, dp 4: per-rank mini 160 / 4 = 40; micro 8 -> 5 micro-batches (odd), micro 4 -> 10
    Case("vpp-5-micro-batches-pp2", "megatron_vpp_micro_batches",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=8), PROBE_WL),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=4), PROBE_WL),
         "must be divisible by num_batches_divided_by 2 for megatron backend"),
    # PP 2, dp 4: per-rank full batch 320 / 4 = 80; log-prob micro 16 -> 5 micro-batches (odd), 8 -> 10
    Case("vpp-5-log-prob-micro-batches-pp2", "megatron_vpp_log_prob_micro_batches",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=4,
                                            log_prob_micro_batch_size_per_gpu=16), PROBE_WL),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=4,
                                            log_prob_micro_batch_size_per_gpu=8), PROBE_WL),
         "(old_log_prob pass)"),
    Case("vpp-5-ref-micro-batches-pp2", "megatron_vpp_ref_micro_batches",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=4,
                                            ref_log_prob_micro_batch_size_per_gpu=16), PROBE_WL),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=4,
                                            ref_log_prob_micro_batch_size_per_gpu=8), PROBE_WL),
         "(ref pass)"),
    Case("ep-on-dense-model", "megatron_experts_divisible_by_ep",
         Setup("qwen2.5-7b", MEGATRON.with_(actor_ep=2)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_ep=1)),
         "needs an MoE model"),
    Case("ep3-does-not-divide-128-experts", "megatron_experts_divisible_by_ep",
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_ep=3), WL_480, gpus_per_node=6, nodes=2),
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_ep=4), WL_480, gpus_per_node=6, nodes=2),
         "num_moe_experts (128) must be divisible by expert_model_parallel_size (3)"),
    Case("ep8-etp2-on-8-gpus", "megatron_expert_group_fits",
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_ep=8, actor_etp=2)),
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_ep=8, actor_etp=1)),
         "world size (8) must be divisible by expert_tensor_parallel_size x expert_model_parallel_size x "
         "pipeline_model_parallel_size (2 x 8 x 1)"),
    Case("ep4-pp4-on-8-gpus", "megatron_expert_group_fits",
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_ep=4, actor_pp=4)),
         Setup("qwen3-30b-a3b", MEGATRON.with_(actor_ep=2, actor_pp=4)),
         "(1 x 4 x 4)"),
    Case("fsdp-with-connections", "megatron_device_max_connections",
         Setup("qwen2.5-7b", FSDP.with_(cuda_device_max_connections=1)),
         Setup("qwen2.5-7b", FSDP.with_(cuda_device_max_connections=0)),
         "CUDA_DEVICE_MAX_CONNECTIONS applies to the Megatron engine only"),
    Case("megatron-with-ulysses", "engine_knobs_match_engine",
         Setup("qwen2.5-7b", MEGATRON.with_(ulysses_sp=2)),
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=2)),
         "ulysses_sequence_parallel_size applies to FSDP"),
    Case("megatron-with-activation-offload", "engine_knobs_match_engine",
         Setup("qwen2.5-7b", MEGATRON.with_(activation_offload=True)),
         Setup("qwen2.5-7b", FSDP.with_(activation_offload=True)),
         "enable_activation_offload is supported by the FSDP engine only"),
    Case("megatron-with-liger", "engine_knobs_match_engine",
         Setup("qwen2.5-7b", MEGATRON.with_(use_liger=True)),
         Setup("qwen2.5-7b", FSDP.with_(use_liger=True)),
         "use_liger is applied by the FSDP engine only"),
    Case("fsdp-with-megatron-tp", "engine_knobs_match_engine",
         Setup("qwen2.5-7b", FSDP.with_(actor_tp=2)),
         Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=2)),
         "apply to the Megatron engine only"),
    Case("fsdp2-with-megatron-pp", "engine_knobs_match_engine",
         Setup("qwen2.5-7b", FSDP.with_(actor_engine="fsdp2", actor_pp=2)),
         Setup("qwen2.5-7b", FSDP.with_(actor_engine="fsdp2")),
         "apply to the Megatron engine only"),
    Case("unknown-strategy", "engine_knobs_match_engine",
         Setup("qwen2.5-7b", FSDP.with_(actor_engine="deepspeed")),
         Setup("qwen2.5-7b", FSDP.with_(actor_engine="fsdp2")),
         "strategy deepspeed not supported"),
    Case("qwen2.5-7b-ulysses-8-heads", "ulysses_heads_divisible",
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=8)),
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=4)),
         "num_attention_heads 28 must be divisible by ulysses_sp_size 8"),
    # 14 heads divide SP 7 and 14; 2 KV heads neither divide 7 nor are divided by it, but 14 % 2 == 0
    # (KV heads repeated). 14 GPUs = 2 nodes x 7; rollout TP 1 keeps the replica rule out of it.
    Case("qwen2.5-0.5b-ulysses-7-kv-heads", "ulysses_heads_divisible",
         Setup("qwen2.5-0.5b", FSDP.with_(ulysses_sp=7, rollout_tp=1), Workload(train_batch_size=112, ppo_mini_batch_size=56),
               gpus_per_node=7, nodes=2),
         Setup("qwen2.5-0.5b", FSDP.with_(ulysses_sp=14, rollout_tp=1), Workload(train_batch_size=112, ppo_mini_batch_size=56),
               gpus_per_node=7, nodes=2),
         "num_key_value_heads 2 must be divisible by ulysses_sp_size 7or vise versa"),
    Case("ulysses-without-remove-padding", "ulysses_needs_remove_padding",
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=2, use_remove_padding=False)),
         Setup("qwen2.5-7b", FSDP.with_(ulysses_sp=2, use_remove_padding=True)),
         "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`."),
    # prompt 512 + response 1024 = 1536 tokens; budget x SP must reach it (seqlen_balancing.py:384-386)
    Case("dynamic-ppo-budget-1024-sp1", "dynamic_bsz_token_floor",
         Setup("qwen2.5-7b", FSDP.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=1024,
                                        log_prob_max_token_len_per_gpu=4096)),
         Setup("qwen2.5-7b", FSDP.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=1024,
                                        log_prob_max_token_len_per_gpu=4096, ulysses_sp=2)),
         "max_token_len must be greater than the sequence length. Got max_token_len=1024 and max_seq_len=1536"),
    Case("dynamic-log-prob-budget-1024", "dynamic_bsz_log_prob_token_floor",
         Setup("qwen2.5-7b", FSDP.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4096,
                                        log_prob_max_token_len_per_gpu=1024)),
         Setup("qwen2.5-7b", FSDP.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4096,
                                        log_prob_max_token_len_per_gpu=1536)),
         "Got max_token_len=1024 and max_seq_len=1536"),
    Case("vllm-256-batched-tokens-512-seqs", "vllm_batched_tokens_cover_seqs",
         Setup("qwen2.5-7b", FSDP.with_(max_num_batched_tokens=256, max_num_seqs=512)),
         Setup("qwen2.5-7b", FSDP.with_(max_num_batched_tokens=512, max_num_seqs=512)),
         "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)."),
    # verl/workers/rollout/vllm_rollout/vllm_async_server.py:1107-1111; Qwen2.5-7B-Instruct's config.json: 32768
    Case("max-model-len-above-context", "max_model_len_within_context",
         Setup("qwen2.5-7b", FSDP, Workload(max_model_len=65536)),
         Setup("qwen2.5-7b", FSDP, Workload(max_model_len=32768)),
         "max_model_len (65536) should be less than or equal to max_position_embeddings (32768)"),
    Case("ref-offload-without-ref", "ref_offload_needs_ref",
         Setup("qwen2.5-7b", FSDP.with_(ref_param_offload=True), Workload(use_kl_loss=False)),
         Setup("qwen2.5-7b", FSDP.with_(ref_param_offload=True), Workload(use_kl_loss=True)),
         "no reference model"),
]


def test_every_rule_has_a_case():
    assert {fn.__name__ for fn in RULES} == {case.rule for case in CASES}
    assert len(RULES) == len({fn.__name__ for fn in RULES}), "duplicate rule names"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_fires_with_verl_wording(case: Case):
    found = case.bad.violations()
    assert case.rule in found, f"{case.rule} missing; got {sorted(found)}"
    assert case.wording in found[case.rule].message
    if case.only:
        assert set(found) == {case.rule}
    else:
        assert set(found) == {case.rule, *case.extra}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_close_neighbour_passes(case: Case):
    found = case.good.violations()
    assert case.rule not in found
    if case.neighbour_clean:
        assert found == {}, f"neighbour should be valid, got {sorted(found)}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_id_is_its_function_name_and_names_a_source(case: Case):
    by_name = {fn.__name__: fn for fn in RULES}
    violation = by_name[case.rule](case.bad.context())
    assert violation is not None and violation.rule == case.rule
    assert violation.source.strip()
    assert violation.enforced_by in ENFORCERS
    assert str(violation).startswith(f"{case.rule}: ")
    assert by_name[case.rule](case.good.context()) is None


# ---- rules that depend on other settings ----------------------------------------------------------

def test_ref_log_prob_rule_skipped_without_kl_loss():
    cand = FSDP.with_(ref_log_prob_micro_batch_size_per_gpu=16)
    with_ref = Setup("qwen2.5-7b", cand, PROBE_WL).violations()
    without_ref = Setup("qwen2.5-7b", cand, Workload(train_batch_size=64, ppo_mini_batch_size=32,
                                                     use_kl_loss=False)).violations()
    assert "ref_log_prob_micro_divides_batch" in with_ref
    assert without_ref == {}


def test_rollout_log_prob_rule_applies_without_kl_loss():
    cand = FSDP.with_(log_prob_micro_batch_size_per_gpu=16)
    found = Setup("qwen2.5-7b", cand, Workload(train_batch_size=64, ppo_mini_batch_size=32, use_kl_loss=False))
    assert set(found.violations()) == {"rollout_log_prob_micro_divides_batch"}


@pytest.mark.parametrize("knob, value", [("ppo_micro_batch_size_per_gpu", 3),
                                         ("log_prob_micro_batch_size_per_gpu", 16),
                                         ("ref_log_prob_micro_batch_size_per_gpu", 16)])
def test_static_micro_batch_rules_skipped_with_dynamic_bsz(knob, value):
    cand = FSDP.with_(use_dynamic_bsz=True, **{knob: value})
    assert Setup("qwen2.5-7b", cand, PROBE_WL).violations() == {}


def test_real_train_batch_rule_skipped_with_dynamic_bsz():
    # verl's validate_config only checks the batch arithmetic when use_dynamic_bsz is off
    cand = FSDP.with_(use_dynamic_bsz=True)
    wl = Workload(train_batch_size=64, ppo_mini_batch_size=32, rollout_n=6)  # 384 % 6 == 0, 320 % 6 != 0
    assert Setup("qwen2.5-7b", cand, PROBE_WL, gpus_per_node=6).violations().keys() == {"mini_batch_divisible_by_dp"}
    assert Setup("qwen2.5-7b", cand, wl, gpus_per_node=6).violations() == {}


def test_vpp_micro_batch_rule_skipped_with_dynamic_bsz():
    cand = MEGATRON.with_(actor_pp=2, actor_vpp=2, ppo_micro_batch_size_per_gpu=8, use_dynamic_bsz=True)
    assert "megatron_vpp_micro_batches" not in Setup("qwen2.5-7b", cand, PROBE_WL).violations()


def test_vpp_micro_batch_rule_needs_vpp():
    # the same odd micro-batch count is fine for plain 1F1B
    cand = MEGATRON.with_(actor_pp=2, ppo_micro_batch_size_per_gpu=8)
    assert Setup("qwen2.5-7b", cand, PROBE_WL).violations() == {}


@pytest.mark.parametrize("budget, sp, ok", [(1535, 1, False), (1536, 1, True), (768, 2, True), (767, 2, False),
                                            (384, 4, True), (383, 4, False)])
def test_dynamic_bsz_token_floor_is_budget_times_ulysses(budget, sp, ok):
    # verl: max_token_len = max_token_len_per_gpu * sp_size must be >= prompt + response (1536)
    cand = FSDP.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget,
                      log_prob_max_token_len_per_gpu=budget, ulysses_sp=sp)
    found = Setup("qwen2.5-7b", cand).violations()
    assert ("dynamic_bsz_token_floor" not in found) is ok
    if not ok:
        assert f"Got max_token_len={budget * sp} and max_seq_len=1536" in found["dynamic_bsz_token_floor"].message


def test_dynamic_bsz_token_floor_skipped_in_static_mode():
    cand = FSDP.with_(ppo_max_token_len_per_gpu=512, log_prob_max_token_len_per_gpu=512)
    assert Setup("qwen2.5-7b", cand).violations() == {}


def test_megatron_connections_only_matter_with_tensor_parallel():
    assert Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=1, cuda_device_max_connections=8)).violations() == {}
    assert Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=1, cuda_device_max_connections=0)).violations() == {}


def test_megatron_kv_head_rule_allows_tp_equal_to_kv_heads():
    # Qwen2.5-7B has 4 KV heads: Megatron TP 4 is the cap
    assert Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=4)).violations() == {}
    assert Setup("qwen2.5-14b", MEGATRON.with_(actor_tp=8)).violations() == {}  # 40 heads, 8 KV heads


def test_ulysses_allows_sp_multiple_of_kv_heads():
    # qwen2.5-1.5b: 12 heads, 2 KV heads; SP 4 repeats KV heads (sp % kv == 0)
    assert Setup("qwen2.5-1.5b", FSDP.with_(ulysses_sp=4)).violations() == {}


def test_megatron_rules_ignore_fsdp_candidates():
    # 7B FSDP with world 12 would break Megatron's PP/TP rules if they applied; they must not
    found = Setup("qwen2.5-7b", FSDP, WL_480, gpus_per_node=6, nodes=2).violations()
    assert found == {}


def test_violation_str_has_rule_and_message():
    found = Setup("qwen2.5-7b", FSDP.with_(rollout_tp=8)).violations()["vllm_heads_divisible_by_tp"]
    assert str(found) == ("vllm_heads_divisible_by_tp: Total number of attention heads (28) must be divisible "
                          "by tensor parallel size (8).")


# ---- verl's defaults are valid -----------------------------------------------------------------

@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_verl_default_candidate_passes_every_rule(model_name, nodes):
    model = MODELS[model_name]
    cand = verl_default_candidate(model, DEFAULT_WL, gpus_per_node=8, nodes=nodes)
    layout = ParallelLayout.of(cand, DEFAULT_WL, gpus_per_node=8, nodes=nodes)
    assert check(model, DEFAULT_WL, cand, layout) == []


@pytest.mark.parametrize("model_name", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-30b-a3b"])
def test_verl_default_candidate_passes_on_the_probe_workload(model_name):
    model = MODELS[model_name]
    cand = verl_default_candidate(model, PROBE_WL, gpus_per_node=8, nodes=1)
    assert cand.ppo_micro_batch_size_per_gpu == 4 and cand.log_prob_micro_batch_size_per_gpu == 8
    layout = ParallelLayout.of(cand, PROBE_WL, gpus_per_node=8, nodes=1)
    assert check(model, PROBE_WL, cand, layout) == []


# ---- where the rules disagree with verl 0.9.1 (bugs, reported) ----------------------------------

def test_dynamic_bsz_token_floor_counts_megatron_context_parallel():
    # budget 1024 x CP 2 = 2048 >= 1536: verl packs these micro-batches without complaint
    cand = MEGATRON.with_(use_dynamic_bsz=True, actor_cp=2, ppo_max_token_len_per_gpu=1024,
                          log_prob_max_token_len_per_gpu=1024)
    found = Setup("qwen2.5-7b", cand).violations()
    assert "dynamic_bsz_token_floor" not in found and "dynamic_bsz_log_prob_token_floor" not in found


def test_vpp_rule_covers_log_prob_micro_batches():
    # PP 2, VPP 2, dp 4: per-rank full batch 320 / 4 = 80; log-prob micro 16 -> 5 micro-batches, odd
    cand = MEGATRON.with_(actor_pp=2, actor_vpp=2, log_prob_micro_batch_size_per_gpu=16)
    found = check(get_model("qwen2.5-7b"), PROBE_WL, cand,
                  ParallelLayout.of(cand, PROBE_WL, gpus_per_node=8, nodes=1))
    assert any("num_batches_divided_by" in v.message for v in found)


def test_replica_rule_matches_verl_for_replicas_smaller_than_a_node():
    # rollout TP 6 on 8-GPU nodes: verl computes min(8, 6) = 6 and 6 % 6 == 0
    cand = FSDP.with_(rollout_tp=6, ppo_micro_batch_size_per_gpu=2, log_prob_micro_batch_size_per_gpu=4,
                      ref_log_prob_micro_batch_size_per_gpu=4)
    found = Setup("qwen2.5-1.5b", cand, WL_480, nodes=3).violations()
    assert "rollout_replica_spans_whole_nodes" not in found


def test_unset_device_max_connections_is_fine_for_megatron_tp():
    assert Setup("qwen2.5-7b", MEGATRON.with_(actor_tp=2, cuda_device_max_connections=0)).violations() == {}
