"""Which of verl's roles a GRPO job runs besides actor and rollout: the single place that decides it.

verl runs a reference policy when `algorithm.use_kl_in_reward` OR `actor.use_kl_loss`
(verl/trainer/ppo/utils.py:75-79 `need_reference_policy`) and a critic when `critic.enable` or the
advantage estimator is GAE (utils.py:96-108 `need_critic`). With LoRA the reference is the actor with
its adapters switched off (verl/trainer/ppo/ray_trainer.py:356-360 `ref_in_actor`, :893-907), so there is no
separate reference model and no `ref.*` knob takes effect (validate_config still wants the ref micro-batch key
set: verl/utils/config.py:168-174).
"""

from __future__ import annotations

from typing import Literal

from autotune.workload import Workload

Reference = Literal["none", "separate", "in-actor"]


def need_reference_policy(workload: Workload) -> bool:
    """verl/trainer/ppo/utils.py:75-79: in-reward KL or KL loss."""
    return bool(workload.use_kl_in_reward or workload.use_kl_loss)


def reference(workload: Workload) -> Reference:
    if not need_reference_policy(workload):
        return "none"
    return "in-actor" if workload.lora_rank > 0 else "separate"


def separate_reference(workload: Workload) -> bool:
    """A reference model of its own: its weights, its log-prob pass and its ref.* knobs."""
    return reference(workload) == "separate"


def need_critic(workload: Workload) -> bool:
    """GRPO never runs a critic (adv_estimator grpo, critic.enable null: verl/trainer/ppo/utils.py:96-108)."""
    return False
