"""autotune's entry point around verl's trainer: one verl launch measures several configurations (issue 28 item 2).

`python -m autotune.verl.step_switch_entry --config-path=RUN --config-name=probe ...` is `python -m verl.trainer.main_ppo`
with three of verl's own extension points filled in, and no verl file changed:

- the TaskRunner: `run_ppo(config, task_runner_class=...)` takes a recipe's runner (`trainer/main_ppo.py:34-41`);
  ours is verl's `TaskRunnerV1` whose process imports this module first, so the trainer below is registered there;
- the trainer: `register_trainer(name)` and `trainer.v1.trainer_mode` pick the trainer class
  (`trainer/ppo/v1/trainer_base.py:1999-2024`, `main_ppo.py:139-141`); ours is verl's `sync` trainer with
  `on_step_begin` (`trainer_base.py:665-667`, called at the start of every step, `:474`) telling the workers the
  step's configuration, and `_init_resource_pool_mgr` swapping in our worker class, as verl's own separate-async
  trainer does for its worker (`trainer/ppo/v1/trainer_separate_async.py:114-126`);
- the worker: verl's `ActorRolloutRefWorker` with one more `@register(Dispatch.ONE_TO_ALL)` method that rewrites
  the engines' per-step fields (autotune/verl/step_knobs.py says which and why that is safe).

The schedule (which configuration each step runs) is a JSON file named by AUTOTUNE_STEP_SCHEDULE, passed to the
Ray actors as verl passes VERL_FILE_LOGGER_PATH. This module imports verl and Ray: only the probe process loads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hydra
import ray

from verl.single_controller.base.decorator import Dispatch, register
from verl.trainer import main_ppo
from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device, get_torch_device
from verl.utils.memory_utils import aggressive_empty_cache
from verl.workers.engine_workers import ActorRolloutRefWorker

from autotune.verl.step_knobs import SCHEDULE_ENV, SWITCH_LOG_SUFFIX, TRAINER_MODE, switch_line

# the worker roles whose class is verl's ActorRolloutRefWorker (trainer_base.py:805-809)
_WORKER_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef, Role.RefPolicy)


class StepSwitchWorker(ActorRolloutRefWorker):
    """verl's hybrid worker, plus the one method the trainer calls before each step."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def autotune_set_step_knobs(self, values: dict) -> dict:
        """Set {role: {EngineConfig field: value}} on this worker's engines (`self.actor`, `self.ref`: the
        TrainingWorkers built at engine_workers.py:587 and :644), return what they now hold. The allocator's cache
        and peak counters are reset so each configuration's steps report their own peak, not an earlier one's."""
        held = {}
        for role, fields in values.items():
            worker = getattr(self, role, None)
            if worker is None:  # this group does not run that role (a separate reference group)
                continue
            for field, value in fields.items():
                setattr(worker.engine_config, field, value)  # EngineConfig._mutable_fields (config/engine.py:78-88)
            held[role] = {field: getattr(worker.engine_config, field) for field in fields}
        aggressive_empty_cache(force_sync=True)
        device = get_torch_device()
        if device.is_available():
            device.reset_peak_memory_stats()
        return held


def read_schedule() -> dict:
    path = os.environ.get(SCHEDULE_ENV)
    if not path:
        raise RuntimeError(f"{SCHEDULE_ENV} is not set: autotune's step switch needs its schedule file")
    return json.loads(Path(path).read_text())


@register_trainer(TRAINER_MODE)
class StepSwitchTrainer(PPOTrainerSync):
    """verl's synchronous trainer; before each step the workers get the configuration the schedule gives it."""

    def __init__(self, config):
        # the registry lookup by our name is done (main_ppo.py:141); from here verl branches on the mode's name for
        # sync against async behaviour (the replay buffer, refills, checkpoints: trainer_base.py:129-157, 731, 902,
        # 1004, 1499), and this is the sync trainer, so it runs under that name
        config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in _WORKER_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(StepSwitchWorker)

    def on_step_begin(self):
        super().on_step_begin()
        plan = getattr(self, "autotune_schedule", None)
        if plan is None:
            plan = self.autotune_schedule = read_schedule()
        index = plan["steps"].get(str(self.global_steps))
        if index is None:
            return
        groups = [self.actor_rollout_wg]
        ref = getattr(self, "ref_policy_wg", None)
        if ref is not None and ref is not self.actor_rollout_wg:
            groups.append(ref)
        held = [group.autotune_set_step_knobs(plan["configs"][index]) for group in groups]  # one dict per rank
        record = {"step": self.global_steps, "config": index, "held": held}
        with open(os.environ[SCHEDULE_ENV] + SWITCH_LOG_SUFFIX, "a") as log:
            log.write(json.dumps(record) + "\n")
        print(switch_line(self.global_steps, index), flush=True)


class StepSwitchTaskRunner(main_ppo.TaskRunnerV1.__ray_actor_class__):  # the class verl decorated (ray/actor.py:2834)
    """verl's TaskRunnerV1. Ray unpickles this class in the runner's process by importing this module, which
    registers StepSwitchTrainer there before `run` looks `trainer.v1.trainer_mode` up."""


@hydra.main(config_path=str(Path(main_ppo.__file__).parent / "config"), config_name="ppo_trainer", version_base=None)
def main(config):
    """verl's main (`trainer/main_ppo.py:166-184`): the same device choice and start-up checks, then our runner."""
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if not config.trainer.use_v1 or config.trainer.v1.trainer_mode != TRAINER_MODE:
        raise ValueError(f"autotune's step switch runs verl's V1 trainer as trainer.v1.trainer_mode={TRAINER_MODE}")
    main_ppo.run_ppo(config, task_runner_class=ray.remote(StepSwitchTaskRunner))

