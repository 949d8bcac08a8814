"""The user's GRPO workload: what the model learns. The tuner holds it fixed.

Defaults are a GSM8K-like GRPO job (verl's examples/grpo_trainer/run_qwen2_5-7b*.sh family:
train batch 1024 prompts, mini-batch 256, n=5, prompt 512 / response 1024, KL loss on).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from autotune.errors import ConfigError


# far above any GRPO job (verl's examples: batches of 1024 prompts, 16k-token responses); beyond it a
# value is a typo, and the cost model's arithmetic on it would take hours
MAX_WORKLOAD_INT = 1 << 24


@dataclass(frozen=True, kw_only=True)
class Workload:
    train_batch_size: int = 1024  # prompts per RL step (data.train_batch_size)
    ppo_mini_batch_size: int = 256  # prompts per optimizer step (actor.ppo_mini_batch_size)
    rollout_n: int = 5  # samples per prompt (rollout.n)
    max_prompt_length: int = 512
    max_response_length: int = 1024
    # Mean prompt length relative to max_prompt_length; GSM8K prompts with the chat template are
    # ~100-250 tokens against a 512 cap. Responses are fixed at max_response_length in probes.
    prompt_fill: float = 0.4
    ppo_epochs: int = 1
    use_kl_loss: bool = True  # GRPO's KL loss: needs a reference model and its log-prob pass
    lora_rank: int = 0
    # LoRA target modules as verl takes them (model.target_modules): "all-linear" or projection names
    lora_target_modules: str | list = "all-linear"
    train_files: str | list = "~/data/gsm8k/train.parquet"  # verl takes one path or a list of paths
    val_files: str | list = "~/data/gsm8k/test.parquet"

    def __post_init__(self) -> None:
        for name in ("train_batch_size", "ppo_mini_batch_size", "rollout_n", "max_prompt_length",
                     "max_response_length", "ppo_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WORKLOAD_INT:
                raise ConfigError(f"workload.{name} must be a positive integer (at most {MAX_WORKLOAD_INT}), but got "
                                  f"{name}={value!r}")
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ConfigError(f"workload.lora_rank must be an integer >= 0, but got lora_rank={self.lora_rank!r}")
        targets = self.lora_target_modules
        if not (isinstance(targets, str) and targets or isinstance(targets, (list, tuple)) and targets
                and all(isinstance(t, str) and t for t in targets)):
            raise ConfigError(f"workload.lora_target_modules must be 'all-linear' or a list of module names, "
                              f"but got lora_target_modules={targets!r}")
        if not (isinstance(self.prompt_fill, (int, float)) and 0 < self.prompt_fill <= 1):
            raise ConfigError(f"workload.prompt_fill must be in (0, 1], but got prompt_fill={self.prompt_fill!r}")
        if self.ppo_mini_batch_size > self.train_batch_size:
            # verl ActorConfig.validate (workers/config/actor.py:222-243)
            raise ConfigError(f"train_batch_size ({self.train_batch_size}) must be >= actor.ppo_mini_batch_size "
                              f"({self.ppo_mini_batch_size})")

    @property
    def seq_len(self) -> int:
        """Longest sequence a micro-batch can hold: prompt + response."""
        return self.max_prompt_length + self.max_response_length

    @property
    def mean_seq_len(self) -> float:
        return self.prompt_fill * self.max_prompt_length + self.max_response_length

    @property
    def trajectories_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n

    @property
    def trajectories_per_mini_batch(self) -> int:
        return self.ppo_mini_batch_size * self.rollout_n

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
