"""The key table (autotune/verl/keys.py): its sources exist in the installed verl wheel, and import(export(c, w))
gives back (c, w) for candidates drawn from the search space."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import optuna
import pytest

from autotune.models import get_model
from autotune.spaces.space import SearchSpace
from autotune.verl.export import hydra_overrides, model_engine, verl_overrides
from autotune.verl.job_import import user_job
from autotune.verl.keys import BY_KEY, OVERRIDE_OPTIMIZER, TABLE, kind_of
from autotune.verl.launch_script import import_launch_text
from autotune.workload import Workload


@pytest.mark.verl
@pytest.mark.parametrize("row", TABLE, ids=lambda k: k.verl_key)
def test_every_rows_source_is_in_the_installed_wheel(row):
    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
    path, line = row.source.split(":", 1)
    line = int(re.match(r"\d+", line).group())
    lines = (root / path).read_text().splitlines()
    leaf = row.verl_key.split(".")[-1]
    if f".{OVERRIDE_OPTIMIZER}." in row.verl_key:  # megatron-core's own field: verl's line is where it passes the dict
        leaf = OVERRIDE_OPTIMIZER
    # the key's own name is at the cited line (give or take a comment line): a moved key fails here
    assert any(leaf in text for text in lines[max(0, line - 3):line + 2]), (row.verl_key, row.source)


def test_one_row_per_key_and_kinds_are_known():
    assert len(BY_KEY) == len(TABLE)
    assert {k.kind for k in TABLE} <= {"workload", "knob", "derived", "job"}
    assert kind_of("actor_rollout_ref.actor.ppo_mini_batch_size") == "workload"
    assert kind_of("actor_rollout_ref.rollout.gpu_memory_utilization") == "system"
    assert kind_of("trainer.logger") == "passthrough"


SETUPS = {
    "fsdp": ("qwen2.5-7b", 8, 1, Workload(), {"actor_engine": "fsdp"}),
    "fsdp2": ("qwen2.5-7b", 8, 1, Workload(use_kl_loss=False, use_kl_in_reward=True), {"actor_engine": "fsdp2"}),
    "megatron": ("qwen2.5-32b", 8, 2, Workload(train_batch_size=512, ppo_mini_batch_size=128),
                 {"actor_engine": "megatron"}),
    "moe": ("qwen3-30b-a3b", 8, 2, Workload(train_batch_size=512, ppo_mini_batch_size=128),
            {"actor_engine": "megatron"}),
    "lora": ("qwen2.5-7b", 8, 1, Workload(lora_rank=64, lora_target_modules=["q_proj", "v_proj"],
                                          max_model_len=4096), {}),
}


def _script(args: list[str]) -> str:
    quoted = [a if "'" not in a else '"' + a + '"' for a in args]
    return "python3 -m verl.trainer.main_ppo \\\n    " + " \\\n    ".join(quoted) + "\n"


@pytest.mark.verl
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_import_of_export_is_the_candidate_and_workload(setup):
    model_name, gpn, nodes, workload, fixed = SETUPS[setup]
    from dataclasses import replace

    from autotune.verl.engines import holds
    from autotune.verl.paths import absolute_files

    model = get_model(model_name)
    held = holds({}, fixed.get("actor_engine", "fsdp"), workload.lora_rank)  # a LoRA job keeps its engine family
    space = SearchSpace.build(model, workload, gpus_per_node=gpn, nodes=nodes, fixed=fixed, holds=held)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(40):
        trial = study.ask()
        candidate, wl = space.suggest(trial, workload)
        study.tell(trial, 0.0)
        args = hydra_overrides(verl_overrides(model, wl, candidate, gpus_per_node=gpn, nodes=nodes),
                               model_engine(candidate))
        job = user_job(import_launch_text(_script(args), source=f"{setup}.sh"))
        # the table writes the vLLM share to 4 decimals (Optuna's float steps carry 1e-16 noise)
        candidate = candidate.with_(gpu_memory_utilization=round(candidate.gpu_memory_utilization, 4))
        # the import makes data files absolute (verl expands no `~`: autotune/verl/paths.py), the only change
        assert job.workload == replace(wl, train_files=absolute_files(wl.train_files, Path.cwd()),
                                       val_files=absolute_files(wl.val_files, Path.cwd()))
        assert job.baseline == candidate, {k: (v, getattr(job.baseline, k)) for k, v in candidate.as_params().items()
                                           if getattr(job.baseline, k) != v}
        assert (job.gpus_per_node, job.nodes) == (gpn, nodes)
        assert not job.unresolved


@pytest.mark.verl_judge
def test_shared_optimizer_fields_are_verls_base_optimizer_config():
    """The optimizer keys an engine switch keeps are exactly the fields of verl's base OptimizerConfig; every other
    field of either engine's optimizer config is that engine's own (or, like `optimizer` and
    `override_optimizer_config`, named alike with another meaning: torch.optim's class name vs Megatron's)."""
    from dataclasses import fields

    from verl.base_config import BaseConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig, McoreOptimizerConfig, OptimizerConfig

    from autotune.verl.engines import SHARED_OPTIM_FIELDS

    base = {f.name for f in fields(OptimizerConfig)} - {f.name for f in fields(BaseConfig)}  # less `_target_`
    assert SHARED_OPTIM_FIELDS == base
    fsdp_own = {f.name for f in fields(FSDPOptimizerConfig)} - base - {'_target_'}
    mcore_own = {f.name for f in fields(McoreOptimizerConfig)} - base - {'_target_'}
    assert fsdp_own & mcore_own == {"optimizer", "override_optimizer_config"}
    assert FSDPOptimizerConfig.optimizer != McoreOptimizerConfig.optimizer  # "AdamW" (torch.optim) vs "adam"


def test_a_job_that_computes_sum_pi_squared_holds_fused_kernels_off():
    """verl refuses calculate_sum_pi_squared with use_fused_kernels (engine/fsdp/transformer_impl.py:1343-1346): a job
    that sets the first never gets the second from the search."""
    from autotune.verl.engines import holds

    script = _script(["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
                      "actor_rollout_ref.actor.calculate_sum_pi_squared=True"])
    job = user_job(import_launch_text(script, source="sum_pi.sh"))
    held = holds(job.passthrough, job.baseline.actor_engine, job.workload.lora_rank)
    assert [h.knob for h in held] == ["use_fused_kernels"]
    space = SearchSpace.build(get_model("qwen2.5-7b"), job.workload, gpus_per_node=8, nodes=1, holds=held)
    assert space.domains["use_fused_kernels"].choices == (False,)
    free = SearchSpace.build(get_model("qwen2.5-7b"), job.workload, gpus_per_node=8, nodes=1)
    assert free.domains["use_fused_kernels"].choices == (False, True)
