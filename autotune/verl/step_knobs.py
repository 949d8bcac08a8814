"""What verl reads at every step, so one launch can measure several configurations (issue 28 item 2).

verl 0.9.1's worker copies the micro-batch and token-budget keys once into its engines' `EngineConfig`
(`workers/engine_workers.py:580-583` for the reference, `:619-628` for the actor) and then reads them from there on
every call: `train_batch` and `infer_batch` inject them into each batch unless the batch carries its own
(`engine_workers.py:351-357`, `:405-411`). verl lists exactly these fields as mutable (`workers/config/engine.py:78-88`,
`EngineConfig._mutable_fields`), and the trainer never reads them (`trainer/ppo/v1/trainer_base.py` has no
micro-batch read; `_get_required_batch_multiple`, `:1589-1606`, uses the mini-batch). So a worker that rewrites these
fields before a step runs that step with another configuration, and the maths of the update does not change (the
mini-batch's token counts are all-gathered for the loss before it is split: `engine_workers.py:289-301`).

Everything else needs a new process: the actor engine and its layout, the rollout's TP and vLLM's engine arguments
(`gpu_memory_utilization`, `max_num_seqs`, ...), offload, the model-level switches (remove-padding, Liger, compile,
gradient checkpointing, fused kernels: applied when the model is built and wrapped; `use_fused_kernels` is in
EngineConfig's mutable fields too, but the model's forward is patched for it once, at build:
`engine/fsdp/transformer_impl.py:323-329`), and dynamic batching (verl's start-up checks
and the trainer's own batch balance read it from the config; `engine_workers.py:616` asserts actor and rollout agree
once, at init).
"""

from __future__ import annotations

from autotune.spaces.candidate import Candidate

# verl config key -> (worker role, the EngineConfig field the worker copied it into)
STEP_FIELDS: dict[str, tuple[str, str]] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("actor", "micro_batch_size_per_gpu"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ("actor", "max_token_len_per_gpu"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ("actor", "infer_micro_batch_size_per_gpu"),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": ("actor", "infer_max_token_len_per_gpu"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ("ref", "infer_micro_batch_size_per_gpu"),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": ("ref", "infer_max_token_len_per_gpu"),
}

# the candidate's fields that reach verl only through STEP_FIELDS (checked against verl/keys.py by the tests)
STEP_KNOBS: frozenset[str] = frozenset({
    "ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu",
    "ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"})

# the trainer subclass autotune registers with verl (`trainer.v1.trainer_mode`), and the schedule it reads
TRAINER_MODE = "autotune_step_switch"
SCHEDULE_ENV = "AUTOTUNE_STEP_SCHEDULE"
SWITCH_LOG_SUFFIX = ".switches.jsonl"  # next to the schedule: each switch and what the workers then held
SWITCH_LINE = "autotune step switch:"  # printed by the trainer before each step, read back by the runner


def shares_launches(passthrough: dict) -> bool:
    """Whether the user's job runs the trainer the step switch extends: verl's V1 `sync` trainer (the default,
    ppo_trainer.yaml:232,238). The legacy trainer and the async modes run their own loops; their probes launch apart."""
    passthrough = passthrough or {}
    return passthrough.get("trainer.use_v1", True) is not False and \
        passthrough.get("trainer.v1.trainer_mode", "sync") == "sync"


def restart_key(candidate: Candidate) -> tuple:
    """What must be equal for two candidates to share one verl launch: every knob except the per-step ones."""
    return tuple(sorted((k, v) for k, v in candidate.as_params().items() if k not in STEP_KNOBS))


def step_values(overrides: dict) -> dict[str, dict[str, int]]:
    """{role: {EngineConfig field: value}} for one configuration, from the exporter's verl keys (the same writer as
    its probe.yaml and best.yaml). A key the exporter leaves out (dynamic batching off: no token budget) is not
    sent, so the worker keeps what it has."""
    values: dict[str, dict[str, int]] = {}
    for key, (role, field) in STEP_FIELDS.items():
        if overrides.get(key) is not None:
            values.setdefault(role, {})[field] = overrides[key]
    return values


def schedule(step_configs: list[int], values: list[dict]) -> dict:
    """The file the trainer reads: for each step (1-based, as verl counts them) the configuration it runs."""
    return {"steps": {str(step): index for step, index in enumerate(step_configs, start=1)}, "configs": values}


def switch_line(step: int, index: int) -> str:
    return f"{SWITCH_LINE} step {step} runs configuration {index}"


def parse_switch_line(line: str) -> tuple[int, int] | None:
    at = line.find(SWITCH_LINE)
    if at < 0:
        return None
    words = line[at + len(SWITCH_LINE):].split()
    try:
        return int(words[1]), int(words[4])
    except (IndexError, ValueError):
        return None
