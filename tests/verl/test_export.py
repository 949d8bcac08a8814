"""Exports are accepted by verl 0.9.1's real Hydra config, and every value arrives."""

import pytest
import yaml

from autotune.errors import ConfigError
from autotune.models import get_model
from autotune.spaces.candidate import Candidate
from autotune.verl.export import (ADDED_KEYS, best_yaml_text, hydra_overrides, model_engine, verl_overrides,
                                     write_best_yaml)
from autotune.workload import Workload

CANDIDATES = {
    "fsdp-static": Candidate(),
    "fsdp2-dynamic-sp-offload": Candidate(actor_engine="fsdp2", ulysses_sp=2, use_dynamic_bsz=True,
                                          ppo_max_token_len_per_gpu=24576, log_prob_max_token_len_per_gpu=49152,
                                          param_offload=True, optimizer_offload=True, ref_param_offload=True,
                                          activation_offload=True, gradient_checkpointing=False,
                                          use_torch_compile=False, enable_chunked_prefill=False, use_liger=True,
                                          use_fused_kernels=True),
    "megatron-tp-pp-vpp": Candidate(actor_engine="megatron", actor_tp=2, actor_pp=2, actor_vpp=7, actor_cp=2,
                                    cuda_device_max_connections=1, rollout_tp=4, gpu_memory_utilization=0.65),
    "megatron-moe-ep": Candidate(actor_engine="megatron", actor_tp=1, actor_ep=8, actor_etp=1, rollout_tp=4,
                                 use_dynamic_bsz=True, gradient_checkpointing=False),
}


def _overrides(name):
    model = get_model("qwen3-30b-a3b" if "moe" in name else "qwen2.5-7b")
    return verl_overrides(model, Workload(), CANDIDATES[name], gpus_per_node=8, nodes=2)


def test_no_removed_key_is_ever_emitted():
    for name in CANDIDATES:
        keys = _overrides(name)
        assert not any("grad_offload" in k for k in keys)
        assert not any(k.endswith("ppo_micro_batch_size") or k.endswith("log_prob_micro_batch_size") for k in keys)


def test_dynamic_and_static_batching_are_exclusive():
    static, dynamic = _overrides("fsdp-static"), _overrides("fsdp2-dynamic-sp-offload")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in static
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" not in static
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" in dynamic
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" not in dynamic
    for flags in (static, dynamic):
        assert flags["actor_rollout_ref.actor.use_dynamic_bsz"] == flags["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"]


def test_hydra_override_strings():
    args = hydra_overrides({"trainer.val_before_train": True, "actor_rollout_ref.rollout.max_model_len": None,
                            "data.train_files": "~/x y.parquet", "actor_rollout_ref.rollout.gpu_memory_utilization": 0.55,
                            ADDED_KEYS[0]: "1"}, "megatron")
    assert args == ["model_engine=megatron", "trainer.val_before_train=True", "actor_rollout_ref.rollout.max_model_len=null",
                    "data.train_files='~/x y.parquet'", "actor_rollout_ref.rollout.gpu_memory_utilization=0.55",
                    f"++{ADDED_KEYS[0]}='1'"]


@pytest.mark.verl
def test_a_users_added_key_keeps_its_plus_on_the_command_line():
    """verl's example run_qwen3moe-30b_megatron_96gb.sh adds model_config.max_position_embeddings under
    override_config with '+'; the command-line export must add it too (`++`), or Hydra refuses ("Could not
    override")."""
    from autotune.verl.compose import compose_overrides

    key = "actor_rollout_ref.model.override_config.model_config.max_position_embeddings"
    args = hydra_overrides({key: 10240, "trainer.val_before_train": False}, "dp")
    assert args == [f"++{key}=10240", "trainer.val_before_train=False"]
    assert compose_overrides(args).actor_rollout_ref.model.override_config.model_config.max_position_embeddings == 10240


def test_best_yaml_names_ppo_trainer_and_only_sets_what_was_chosen(tmp_path):
    text = best_yaml_text(_overrides("megatron-tp-pp-vpp"), "megatron", ["header line"])
    assert text.startswith("# header line\n")
    doc = yaml.safe_load(text)
    assert doc["defaults"] == ["ppo_trainer", {"override model_engine": "megatron"}, "_self_"]
    assert doc["hydra"]["searchpath"] == ["pkg://verl.trainer.config"]
    assert doc["actor_rollout_ref"]["actor"]["megatron"]["virtual_pipeline_model_parallel_size"] == 7


@pytest.mark.verl
@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_every_override_composes_with_verls_config_and_arrives(name):
    from autotune.verl.compose import compose_overrides, select

    overrides = _overrides(name)
    cfg = compose_overrides(hydra_overrides(overrides, model_engine(CANDIDATES[name])))
    for key, value in overrides.items():
        assert select(cfg, key) == value, key


@pytest.mark.verl
@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_exported_best_yaml_composes_and_every_value_arrives(tmp_path, name):
    from autotune.verl.compose import compose_exported, select

    overrides = _overrides(name)
    path = write_best_yaml(tmp_path / "best.yaml", overrides, model_engine(CANDIDATES[name]), ["test"])
    cfg = compose_exported(path)
    for key, value in overrides.items():
        assert select(cfg, key) == value, key
    if CANDIDATES[name].is_megatron:  # the reference model follows the actor's layout
        assert select(cfg, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size") == CANDIDATES[name].actor_tp
    else:
        assert select(cfg, "actor_rollout_ref.ref.ulysses_sequence_parallel_size") == CANDIDATES[name].ulysses_sp


@pytest.mark.verl
def test_composition_fails_loudly_on_an_unknown_key():
    from autotune.verl.compose import compose_overrides

    with pytest.raises(ConfigError, match="Could not override 'actor_rollout_ref.actor.megatron.grad_offload'"):
        compose_overrides(["model_engine=megatron", "actor_rollout_ref.actor.megatron.grad_offload=True"])


@pytest.mark.verl
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_rank_and_target_modules_compose_and_arrive(tmp_path, targets):
    from autotune.verl.compose import compose_exported, compose_overrides, select

    workload = Workload(lora_rank=32, lora_target_modules=targets)
    overrides = verl_overrides(get_model("qwen2.5-7b"), workload, Candidate(), gpus_per_node=8, nodes=1)
    engine = model_engine(Candidate())
    for cfg in (compose_overrides(hydra_overrides(overrides, engine)),
                compose_exported(write_best_yaml(tmp_path / "best.yaml", overrides, engine, ["test"]))):
        assert select(cfg, "actor_rollout_ref.model.lora_rank") == 32
        got = select(cfg, "actor_rollout_ref.model.target_modules")
        assert (list(got) if not isinstance(got, str) else got) == targets
