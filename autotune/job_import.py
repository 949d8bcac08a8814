"""From the user's own verl job (a launch script or a YAML config) to autotune's terms.

The imported job is split with the knob table (autotune/knobs.py): workload values become the Workload
held fixed, system values become the baseline Candidate (measured first), the GPU count comes from the
trainer keys, and every other key is passed through to the export unchanged, typed exactly as Hydra
would type the override. Anything that cannot be read statically is reported by name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from autotune.errors import ConfigError
from autotune.knobs import ARO, JOB_KEYS, SYSTEM_BY_KEY, WORKLOAD_BY_KEY, kind_of
from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

# verl's deprecated global micro-batch keys (actor.py:195-220): per-GPU value = global / world size.
DEPRECATED_GLOBAL_MICRO = {
    f"{ARO}.actor.ppo_micro_batch_size": "ppo_micro_batch_size_per_gpu",
    f"{ARO}.rollout.log_prob_micro_batch_size": "log_prob_micro_batch_size_per_gpu",
    f"{ARO}.ref.log_prob_micro_batch_size": "ref_log_prob_micro_batch_size_per_gpu",
}


# verl 0.9.1's own defaults for the workload keys a script may leave out (legacy_data.yaml, actor.yaml,
# rollout.yaml): the imported workload starts from these, not from autotune's GSM8K defaults.
VERL_DEFAULT_WORKLOAD = Workload(train_batch_size=1024, ppo_mini_batch_size=256, rollout_n=1, max_prompt_length=512,
                                 max_response_length=512, ppo_epochs=1, use_kl_loss=False, lora_rank=0,
                                 train_files="~/data/rlhf/gsm8k/train.parquet",
                                 val_files="~/data/rlhf/gsm8k/test.parquet")


@dataclass(frozen=True)
class UserJob:
    source: str
    model: ModelSpec
    gpus_per_node: int | None
    nodes: int | None
    workload: Workload
    baseline: Candidate  # the user's system knobs over verl's defaults
    passthrough: dict  # every other key, typed as Hydra types it
    unresolved: tuple[str, ...]


def hydra_value(key: str, text: str):
    """The value Hydra's override grammar gives `key=text` (lists, numbers, booleans, null, strings)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(f"{key}={text}").value()
    except Exception as exc:  # hydra raises OverrideParseException and friends
        raise ConfigError(f"cannot read {key}={text!r} as a Hydra value: {str(exc).splitlines()[0]}") from None


_FIELD_TYPES = {f.name: f.type for f in fields(Candidate)} | {f.name: f.type for f in fields(Workload)}


def _typed(field: str, key: str, value):
    if isinstance(value, str) and ("$" in value or "`" in value):
        if field in ("train_files", "val_files"):
            return value  # only exported, never modelled: kept as written (the importer reported the name)
        raise ConfigError(f"{key} is not readable statically ({value}); give its value after --, e.g. "
                          f"-- {key}=VALUE")
    expected = _FIELD_TYPES[field]
    if expected == "bool" and isinstance(value, bool) or expected.startswith("str") and isinstance(value, str):
        return value
    if expected == "str | list" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if expected == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if expected == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if expected.startswith("int") and value is None and field == "actor_vpp":
        return 1  # verl's null means no virtual pipeline
    raise ConfigError(f"{key}={value!r}: expected {expected} for {field}")


def _shell_computed(text) -> bool:
    """A value the shell computes at run time ($VAR, ${...}, $(...), backticks): never exported as text."""
    return isinstance(text, str) and ("$" in text or "`" in text)


def user_job(imported, *, model_name: str | None = None) -> UserJob:
    """Split an ImportedJob (autotune/launch_script.py) into workload, baseline and passthrough.

    Every key that cannot be read is collected and reported in one ConfigError, so a script needs one
    fix-and-rerun, not one per key. Passthrough values the shell computes are reported and left out of the
    export (Hydra would read `${...}` as an interpolation and a `$(date)` as text)."""
    from autotune.model_config import resolve_model

    unresolved = list(imported.unresolved)
    errors: list[str] = []
    dropped = set(getattr(imported, "unresolved_keys", ()) or ())
    values = {}
    for k, v in imported.overrides.items():
        if k.startswith("~"):
            continue
        try:
            values[k] = hydra_value(k.lstrip("+"), v)
        except ConfigError as exc:
            if not _shell_computed(v):
                errors.append(str(exc).removeprefix("cannot read "))
                continue
            values[k] = v
            dropped.add(k)
    unresolved += [f"{k} (deletion cannot be exported)" for k in imported.overrides if k.startswith("~")]
    config_name = (imported.config_name or "ppo_trainer").removesuffix(".yaml")
    if config_name not in ("ppo_trainer", "ppo_megatron_trainer"):
        unresolved.append(f"--config-name={imported.config_name} (only verl's ppo_trainer is read)")
    path_key = f"{ARO}.model.path"
    path = values.get(path_key)
    model = None
    if model_name:
        try:
            model = resolve_model(model_name)
        except ConfigError as exc:
            errors.append(str(exc))
    elif path_key in dropped or _shell_computed(path):
        errors.append(f"{path_key} is computed by the shell ({imported.overrides.get(path_key)}); pass --model "
                      "or give it after --")
    elif isinstance(path, str) and path:
        try:
            model = resolve_model(path)
        except ConfigError as exc:
            errors.append(f"{path_key}={path}: {exc}" if path not in str(exc) else str(exc))
    elif path_key not in values and not any(e.startswith(path_key) for e in errors):
        errors.append(f"{path_key} is not set; pass --model")
    workload_changes, candidate_changes, passthrough = {}, {}, {}
    if config_name == "ppo_megatron_trainer":  # verl's shim: ppo_trainer with model_engine=megatron
        candidate_changes["actor_engine"] = "megatron"
    for key, value in values.items():
        bare = key.lstrip("+")
        kind = kind_of(bare)
        modelled = (kind == "workload" and WORKLOAD_BY_KEY[bare].field) or (kind == "system" and SYSTEM_BY_KEY[bare].field)
        raw = str(imported.overrides.get(key, value))
        data_file = kind == "workload" and WORKLOAD_BY_KEY[bare].field in ("train_files", "val_files")
        if (key in dropped or _shell_computed(value)) and not (data_file and "$(" not in raw and "`" not in raw):
            if modelled:
                errors.append(f"{key}={imported.overrides.get(key, value)} (computed by the shell)")
            elif bare != path_key.lstrip("+"):
                unresolved.append(f"{key} (value {imported.overrides.get(key, value)!r} is computed by the shell "
                                  "at run time; not exported, give it after --)")
            continue
        try:
            if kind == "workload" and WORKLOAD_BY_KEY[bare].field:
                workload_changes[WORKLOAD_BY_KEY[bare].field] = _typed(WORKLOAD_BY_KEY[bare].field, key, value)
            elif kind == "system" and SYSTEM_BY_KEY[bare].field:
                field = SYSTEM_BY_KEY[bare].field
                candidate_changes[field] = (value if field == "actor_engine" else _typed(field, key, value))
            elif bare == "model_engine":
                if value == "megatron":
                    candidate_changes["actor_engine"] = "megatron"
            elif kind in ("system",) or bare in JOB_KEYS or bare in DEPRECATED_GLOBAL_MICRO:
                continue
            else:
                passthrough[bare] = value
        except ConfigError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError(f"{imported.source}: cannot read {len(errors)} key(s) statically, all of them: "
                          + "; ".join(dict.fromkeys(errors))
                          + "; give their values after --, e.g. -- KEY=VALUE (or --model for the model)")
    gpn, nodes = values.get("trainer.n_gpus_per_node"), values.get("trainer.nnodes")
    for key, field in DEPRECATED_GLOBAL_MICRO.items():
        if key in values and isinstance(gpn, int):
            world = gpn * (nodes if isinstance(nodes, int) else 1)
            candidate_changes.setdefault(field, max(int(values[key]) // world, 1))
    if "CUDA_DEVICE_MAX_CONNECTIONS" in imported.env and candidate_changes.get("actor_engine") == "megatron":
        candidate_changes.setdefault("cuda_device_max_connections", int(imported.env["CUDA_DEVICE_MAX_CONNECTIONS"]))
    if candidate_changes.get("actor_engine") != "megatron":
        candidate_changes["cuda_device_max_connections"] = 0
    if not candidate_changes.get("use_dynamic_bsz") and "ppo_micro_batch_size_per_gpu" not in candidate_changes:
        unresolved.append("actor.ppo_micro_batch_size_per_gpu (not set: verl refuses to start without it; the "
                          "baseline uses the quickstart's 4)")
    try:
        workload = replace(VERL_DEFAULT_WORKLOAD, **workload_changes)
        baseline = Candidate(**candidate_changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{imported.source}: {exc}") from None
    return UserJob(source=imported.source, model=model,
                   gpus_per_node=gpn if isinstance(gpn, int) else None,
                   nodes=nodes if isinstance(nodes, int) else None, workload=workload, baseline=baseline,
                   passthrough=passthrough, unresolved=tuple(unresolved))
