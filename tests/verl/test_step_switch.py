"""autotune's trainer, worker and task runner around verl's (autotune/verl/step_switch.py), checked against verl
0.9.1's own classes: the registry, the worker mapping of a composed config, the engines' mutable fields, the
sync behaviour; and the per-step knobs (autotune/verl/step_knobs.py) against verl's key table and exporter."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from autotune.models import get_model
from autotune.spaces.candidate import Candidate
from autotune.verl.export import verl_overrides
from autotune.verl.keys import TABLE
from autotune.verl.step_knobs import (STEP_FIELDS, STEP_KNOBS, SCHEDULE_ENV, SWITCH_LOG_SUFFIX, TRAINER_MODE,
                                      restart_key, schedule, shares_launches, step_values)
from autotune.workload import Workload


def test_the_per_step_knobs_are_the_fields_whose_only_keys_verl_reads_per_step():
    keys_of = {}
    for row in TABLE:
        if row.field:
            keys_of.setdefault(row.field, set()).add(row.verl_key)
    assert {f for f, keys in keys_of.items() if keys <= set(STEP_FIELDS)} == STEP_KNOBS
    assert set(STEP_FIELDS) <= {row.verl_key for row in TABLE}


@pytest.mark.parametrize("dynamic", [False, True])
def test_step_values_come_from_the_exporter(dynamic):
    wl = Workload(use_kl_loss=True)
    cand = Candidate(use_dynamic_bsz=dynamic, ppo_micro_batch_size_per_gpu=16, log_prob_micro_batch_size_per_gpu=32,
                     ref_log_prob_micro_batch_size_per_gpu=64, ppo_max_token_len_per_gpu=12288,
                     log_prob_max_token_len_per_gpu=24576)
    values = step_values(verl_overrides(get_model("qwen2.5-7b"), wl, cand, gpus_per_node=8, nodes=1))
    if dynamic:
        assert values == {"actor": {"max_token_len_per_gpu": 12288, "infer_max_token_len_per_gpu": 24576},
                          "ref": {"infer_max_token_len_per_gpu": 24576}}
    else:
        assert values == {"actor": {"micro_batch_size_per_gpu": 16, "infer_micro_batch_size_per_gpu": 32},
                          "ref": {"infer_micro_batch_size_per_gpu": 64}}


def test_the_restart_key_ignores_exactly_the_per_step_knobs():
    base = Candidate()
    assert restart_key(base) == restart_key(base.with_(ppo_micro_batch_size_per_gpu=32, log_prob_max_token_len_per_gpu=4096))
    for change in ({"gpu_memory_utilization": 0.7}, {"gradient_checkpointing": False}, {"use_dynamic_bsz": True},
                   {"rollout_tp": 4}, {"use_remove_padding": False}):
        assert restart_key(base) != restart_key(base.with_(**change)), change


def test_only_the_sync_v1_trainer_shares_launches():
    assert shares_launches({}) and shares_launches({"trainer.v1.trainer_mode": "sync"})
    assert not shares_launches({"trainer.use_v1": False})
    assert not shares_launches({"trainer.v1.trainer_mode": "colocate_async"})


@pytest.mark.verl_judge
def test_verl_lets_the_worker_rewrite_each_per_step_field():
    from verl.workers.config.engine import EngineConfig, FSDPEngineConfig, McoreEngineConfig

    fields = {field for _role, field in STEP_FIELDS.values()}
    assert fields <= EngineConfig._mutable_fields
    for config in (FSDPEngineConfig(), McoreEngineConfig()):
        for field in fields:
            setattr(config, field, 7)  # verl's BaseConfig raises FrozenInstanceError on a frozen field
            assert getattr(config, field) == 7


@pytest.mark.verl_judge
def test_the_trainer_is_verls_sync_trainer_registered_under_autotunes_mode():
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from autotune.verl import step_switch

    assert get_trainer_cls(TRAINER_MODE) is step_switch.StepSwitchTrainer
    assert issubclass(step_switch.StepSwitchTrainer, PPOTrainerSync)
    from verl.trainer.main_ppo import TaskRunnerV1
    assert step_switch.StepSwitchTaskRunner.__mro__[1] is TaskRunnerV1.__ray_actor_class__


@pytest.mark.verl_judge
def test_the_trainer_runs_under_the_sync_name_verl_branches_on(monkeypatch):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from autotune.verl.step_switch import StepSwitchTrainer

    seen = {}
    monkeypatch.setattr(PPOTrainer, "__init__", lambda self, config: seen.update(mode=config.trainer.v1.trainer_mode))
    StepSwitchTrainer(OmegaConf.create({"trainer": {"v1": {"trainer_mode": TRAINER_MODE}}}))
    assert seen == {"mode": "sync"}


@pytest.mark.verl_judge
@pytest.mark.parametrize("kl", [False, True])
def test_the_trainer_swaps_in_the_worker_for_verls_roles(tmp_path, kl):
    from autotune.verl.compose import compose_overrides
    from autotune.verl.export import hydra_overrides
    from autotune.verl.step_switch import StepSwitchTrainer, StepSwitchWorker

    overrides = verl_overrides(get_model("qwen2.5-1.5b"), Workload(use_kl_loss=kl), Candidate(rollout_tp=1),
                               gpus_per_node=1, nodes=1)
    config = compose_overrides(hydra_overrides(overrides, "dp"))
    trainer = object.__new__(StepSwitchTrainer)
    trainer.config = config
    trainer._init_resource_pool_mgr()
    classes = {role: cls.__ray_metadata__.modified_class.__ray_actor_class__
               for role, cls in trainer.role_worker_mapping.items()}
    assert classes and set(classes.values()) == {StepSwitchWorker}
    assert {role.name for role in classes} == ({"ActorRolloutRef"} if kl else {"ActorRollout"})


@pytest.mark.verl_judge
def test_the_worker_method_sets_the_engines_and_is_dispatched_to_every_rank():
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch
    from verl.workers.config.engine import FSDPEngineConfig

    from autotune.verl.step_switch import StepSwitchWorker

    assert getattr(StepSwitchWorker.autotune_set_step_knobs, MAGIC_ATTR)["dispatch_mode"] is Dispatch.ONE_TO_ALL
    worker = SimpleNamespace(actor=SimpleNamespace(engine_config=FSDPEngineConfig()), ref=None)
    held = StepSwitchWorker.autotune_set_step_knobs(worker, {"actor": {"micro_batch_size_per_gpu": 16},
                                                             "ref": {"infer_micro_batch_size_per_gpu": 8}})
    assert held == {"actor": {"micro_batch_size_per_gpu": 16}}  # no reference engine in this group
    assert worker.actor.engine_config.micro_batch_size_per_gpu == 16


@pytest.mark.verl_judge
def test_each_step_tells_every_worker_group_and_records_the_switch(tmp_path, monkeypatch):
    from autotune.verl.step_switch import StepSwitchTrainer

    path = tmp_path / "step_schedule.json"
    path.write_text(json.dumps(schedule([0, 0, 1], [{"actor": {"micro_batch_size_per_gpu": 2}},
                                                    {"actor": {"micro_batch_size_per_gpu": 8}}])))
    monkeypatch.setenv(SCHEDULE_ENV, str(path))
    calls = []
    group = lambda name: SimpleNamespace(autotune_set_step_knobs=lambda v: calls.append((name, v)) or [v])
    trainer = object.__new__(StepSwitchTrainer)
    trainer.actor_rollout_wg, trainer.ref_policy_wg = group("actor"), group("ref")
    for step in (1, 2, 3, 4):  # step 4 is past the plan: the workers keep what they hold
        trainer.global_steps = step
        trainer.on_step_begin()
    assert [c[0] for c in calls] == ["actor", "ref"] * 3
    assert calls[-1] == ("ref", {"actor": {"micro_batch_size_per_gpu": 8}})
    records = [json.loads(line) for line in (tmp_path / f"step_schedule.json{SWITCH_LOG_SUFFIX}").read_text().splitlines()]
    assert [(r["step"], r["config"]) for r in records] == [(1, 0), (2, 0), (3, 1)]


@pytest.mark.verl_judge
def test_the_entry_point_starts_as_a_user_runs_it(tmp_path):
    """`python -m` the entry point the runner launches, up to Hydra's composed config (`--cfg job` stops before
    Ray): the module imports, registers once and composes the probe's config with autotune's overrides."""
    import subprocess

    from autotune.backends.base import ProbeRequest
    from autotune.backends.verl.runner import STEP_SWITCH_ENTRY, probe_command
    from autotune.hardware import get_gpu

    request = ProbeRequest(model=get_model("qwen2.5-1.5b"), gpu=get_gpu("H200"), n_gpus=1, nodes=1,
                           workload=Workload(), candidate=Candidate(rollout_tp=1), run_dir=tmp_path / "run")
    argv, env, _ = probe_command(request, entry=STEP_SWITCH_ENTRY, total_steps=3,
                                 extra=[f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    done = subprocess.run([*argv, "--cfg", "job"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"trainer_mode: {TRAINER_MODE}" in done.stdout and "total_training_steps: 3" in done.stdout


@pytest.mark.verl_judge
@pytest.mark.parametrize("kl", [False, True])
def test_verl_validates_the_shared_launchs_config(tmp_path, kl):
    """verl's own start-up check on what a shared launch runs: the probe config with autotune's trainer mode and
    the schedule's env var (main() calls validate_config before Ray starts)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from autotune.backends.base import ProbeRequest
    from autotune.backends.verl.runner import probe_command
    from autotune.hardware import get_gpu
    from autotune.verl.compose import compose_exported

    request = ProbeRequest(model=get_model("qwen2.5-1.5b"), gpu=get_gpu("H200"), n_gpus=1, nodes=1,
                           workload=Workload(use_kl_loss=kl, train_batch_size=16, ppo_mini_batch_size=16, rollout_n=8),
                           candidate=Candidate(rollout_tp=1), run_dir=tmp_path / "run")
    argv, _, _ = probe_command(request, total_steps=8, extra=[
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{SCHEDULE_ENV}='{tmp_path / 'step_schedule.json'}'"])
    config = compose_exported(tmp_path / "run" / "probe.yaml", argv[5:])
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.trainer.v1.trainer_mode == TRAINER_MODE
    assert config.trainer.total_training_steps == 8
