"""The user's GRPO workload: what the model learns. The tuner holds it fixed.

Defaults are a GSM8K-like GRPO job (verl's examples/grpo_trainer/run_qwen2_5-7b*.sh family:
train batch 1024 prompts, mini-batch 256, n=5, prompt 512 / response 1024, KL loss on).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

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
    # Mean response length in tokens (verl's response_length/mean). None: every response runs to
    # max_response_length, the conservative default and what the probes run. In tune.yaml also as
    # `response_length: {mean: 680, max: 1024}`. The time model prices generation over the lengths (the step
    # lasts until the longest response of a replica is done: max_response_length) and the training passes at
    # the mean; memory is checked at max_response_length (a late long-response OOM is real: verl issue 1232)
    # and `autotune estimate` also reports it at the mean.
    mean_response_length: float | None = None
    ppo_epochs: int = 1
    use_kl_loss: bool = True  # GRPO's KL loss: needs a reference model and its log-prob pass
    # KL penalty in the reward (algorithm.use_kl_in_reward): also needs the reference (autotune/verl/roles.py)
    use_kl_in_reward: bool = False
    # rollout.max_model_len as the user set it; None: autotune exports prompt + response (verl's null would mean
    # the model's whole context: vllm_async_server.py:1104)
    max_model_len: int | None = None
    lora_rank: int = 0
    # LoRA target modules as verl takes them (model.target_modules): "all-linear" or projection names
    lora_target_modules: str | list = "all-linear"
    # Megatron's CPU optimizer as the user set it (actor.optim.override_optimizer_config; megatron-core
    # OptimizerConfig: optimizer_cpu_offload False, optimizer_offload_fraction 0.0 by default): that fraction of the
    # distributed optimizer's state and its Adam step stay on the host (optimizer/cpu_offloading/hybrid_optimizer.py)
    megatron_optimizer_cpu_offload: bool = False
    megatron_optimizer_offload_fraction: float = 0.0
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
        fraction = self.megatron_optimizer_offload_fraction
        if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 <= fraction <= 1):
            raise ConfigError("workload.megatron_optimizer_offload_fraction must be in [0, 1], but got "
                              f"megatron_optimizer_offload_fraction={fraction!r}")
        if not isinstance(self.megatron_optimizer_cpu_offload, bool):
            raise ConfigError("workload.megatron_optimizer_cpu_offload must be true or false, but got "
                              f"megatron_optimizer_cpu_offload={self.megatron_optimizer_cpu_offload!r}")
        if not (isinstance(self.prompt_fill, (int, float)) and 0 < self.prompt_fill <= 1):
            raise ConfigError(f"workload.prompt_fill must be in (0, 1], but got prompt_fill={self.prompt_fill!r}")
        mean = self.mean_response_length
        if mean is not None and not (isinstance(mean, (int, float)) and not isinstance(mean, bool)
                                     and 0 < mean <= self.max_response_length):
            raise ConfigError(f"workload.mean_response_length must be in (0, max_response_length="
                              f"{self.max_response_length}], but got mean_response_length={mean!r}")
        if self.ppo_mini_batch_size > self.train_batch_size:
            # verl ActorConfig.validate (workers/config/actor.py:222-243)
            raise ConfigError(f"train_batch_size ({self.train_batch_size}) must be >= actor.ppo_mini_batch_size "
                              f"({self.ppo_mini_batch_size})")

    @property
    def megatron_optimizer_on_host(self) -> float:
        """Share of the Megatron distributed optimizer's state the CPU optimizer keeps on the host."""
        return float(self.megatron_optimizer_offload_fraction) if self.megatron_optimizer_cpu_offload else 0.0

    @property
    def seq_len(self) -> int:
        """Longest sequence a micro-batch can hold: prompt + response."""
        return self.max_prompt_length + self.max_response_length

    @property
    def response_mean(self) -> float:
        """Mean response length (tokens): max_response_length unless mean_response_length says otherwise."""
        return float(self.max_response_length if self.mean_response_length is None else self.mean_response_length)

    @property
    def rollout_max_model_len(self) -> int:
        """The max_model_len vLLM runs with: the user's, or the prompt + response autotune exports."""
        return self.max_model_len or self.seq_len

    @property
    def mean_seq_len(self) -> float:
        return self.prompt_fill * self.max_prompt_length + self.response_mean

    def at_max_length(self) -> "Workload":
        """The same job with every response at max_response_length: what memory is checked against."""
        if self.mean_response_length is None:
            return self
        return replace(self, mean_response_length=None)

    @staticmethod
    def expand_response_length(raw: dict) -> dict:
        """tune.yaml's `response_length: {mean, max}` as mean_response_length and max_response_length."""
        if "response_length" not in raw:
            return raw
        out = {k: v for k, v in raw.items() if k != "response_length"}
        spec = raw["response_length"]
        if not isinstance(spec, dict) or not set(spec) <= {"mean", "max"} or not spec:
            raise ConfigError(f"workload.response_length must be a mapping {{mean: ..., max: ...}}, but got "
                              f"response_length={spec!r}")
        if "max" in spec:
            out["max_response_length"] = spec["max"]
        if "mean" in spec:
            out["mean_response_length"] = spec["mean"]
        return out

    @property
    def trajectories_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n

    @property
    def trajectories_per_mini_batch(self) -> int:
        return self.ppo_mini_batch_size * self.rollout_n

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
