"""From the user's own verl job (a launch script or a YAML config) to autotune's terms.

The imported job is split with the key table (autotune/verl/keys.py: each row's field and `from_verl`
conversion): workload values become the Workload held fixed, system values become the baseline Candidate
(measured first), the GPU count comes from the trainer keys, and every other key is passed through to the
export, typed exactly as Hydra would type the override. Anything that cannot be read statically is reported
by name, every such key in one error.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from autotune.errors import ConfigError
from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.verl.export import verl_declared_keys
from autotune.verl.keys import (ARO, BY_KEY, DEPRECATED_GLOBAL_MICRO, JOB_KEYS, NOT_IN_VERL, OTC, TABLE,
                                WORKLOAD_FIELDS, active_knobs_for)
from autotune.verl.paths import absolute_files, absolute_passthrough
from autotune.workload import Workload


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
    notes: tuple[str, ...] = ()  # what autotune does differently from the script as written, one line each
    env: dict = field(default_factory=dict)  # what the script exports to the job: probes, best.yaml and train get it


# environment variables the key table searches as knobs (exported through ray_kwargs...env_vars): the candidate's
# value is what a probe and the export set, so the script's own value is read into the baseline, not carried
_RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars."
ENV_KNOBS = frozenset(k.verl_key[len(_RUNTIME_ENV):] for k in TABLE if k.verl_key.startswith(_RUNTIME_ENV) and k.field)


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
    if expected == "int | None" and (value is None or isinstance(value, int) and not isinstance(value, bool)):
        return value
    if expected.startswith("int") and value is None and field == "actor_vpp":
        return 1  # verl's null means no virtual pipeline
    raise ConfigError(f"{key}={value!r}: expected {expected} for {field}")


def user_job(imported, *, model_name: str | None = None, exporting: bool = True, cwd: Path | None = None) -> UserJob:
    """Split an ImportedJob (autotune/verl/launch_script.py) into workload, baseline and passthrough. `exporting`:
    the job will be exported (run, export, train), so every key the shell computes is asked for; an estimate asks
    only for those it models.

    Every key that cannot be read is collected and reported in one ConfigError that ends with the rerun to paste
    (`-- KEY=VALUE ...`), so a script needs one fix-and-rerun, not one per key. A value the shell computes is never
    exported as text (Hydra would read `${...}` as an interpolation and a `$(date)` as text) nor dropped.

    Data files and the user's other local paths are made absolute against `cwd` (where the script is run from; the
    current folder by default): verl expands no `~` and a probe runs in its own folder (autotune/verl/paths.py)."""
    from autotune.model_config import resolve_model

    if imported.entry_module != "verl.trainer.main_ppo":
        raise ConfigError(f"{imported.source}: runs `python -m {imported.entry_module}`, a recipe's own trainer; "
                          "autotune measures and exports verl.trainer.main_ppo only, which would silently drop what "
                          "the recipe adds (its own config keys and training loop): not imported")
    unresolved = list(imported.unresolved)
    notes: list[str] = []
    errors: list[str] = []
    computed: dict[str, str] = {}  # key -> the shell text it is computed from: each must be given after --
    dropped = set(getattr(imported, "unresolved_keys", ()) or ())
    unparsed: list[str] = []  # keys whose value Hydra cannot parse: asked for after -- as well
    values = {}
    for k, v in imported.overrides.items():
        if k.startswith("~"):
            continue
        try:
            values[k] = hydra_value(k.lstrip("+"), v)
        except ConfigError as exc:
            if k not in dropped:
                errors.append(str(exc).removeprefix("cannot read "))
                unparsed.append(k.lstrip("+"))
                continue
            values[k] = v  # holds what the shell would compute at run time
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
    elif path_key in dropped:
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
    if values.get("model_engine") == "megatron" or values.get(f"{ARO}.actor.strategy") == "megatron":
        candidate_changes["actor_engine"] = "megatron"
    megatron = candidate_changes.get("actor_engine") == "megatron"
    if megatron and config_name != "ppo_megatron_trainer" and values.get("model_engine") != "megatron":
        notes.append("actor.strategy=megatron without model_engine=megatron: verl 0.9.1 then composes its FSDP "
                     "engine and refuses the job's megatron.* keys (\"Could not override\"); read as a Megatron job "
                     "and exported with model_engine=megatron")
    rollout_name = values.get(f"{ARO}.rollout.name")
    if rollout_name not in (None, "vllm"):
        notes.append(f"rollout.name={rollout_name}: probes on a GPU run {rollout_name}, but the model behind `sim` "
                     "and the memory gate price vLLM's engine; its predictions for this job are vLLM's")
    if str(values.get(f"{ARO}.rollout.enforce_eager")).lower() == "true":
        # kept as the job sets it: CUDA graphs' memory, which vLLM does not count in gpu_memory_utilization, is not
        # modelled, so autotune does not turn them on; the time model prices the eager decode (verl/rollout.py
        # vllm_eager, model/cost.py _rollout_s, fitted on the H200 recipe job: benchmarks/fit_eager_decode.py)
        notes.append("rollout.enforce_eager=True: kept (CUDA graphs would speed decoding up, but their memory is not "
                     "modelled, so autotune does not turn them on); the model prices eager decoding, about 0.5 ms "
                     "per layer per decode step as measured on an H200")
    plus = [k for k in values if k.startswith("+") and not k.startswith("++")]
    declared = verl_declared_keys("megatron" if megatron else "dp") if plus else None  # composes verl's config
    appended = [k for k in plus if declared is not None and k[1:] in declared]
    if appended:
        notes.append(f"{', '.join(appended)}: verl 0.9.1 declares {'these keys' if len(appended) > 1 else 'this key'}"
                     ", so Hydra refuses the `+` (\"Could not append to config\"); exported without it")
    bare_values = {key.lstrip("+"): value for key, value in values.items()}
    field_keys: dict[str, list] = {}  # candidate field -> the user's (key, value) it came from
    unreadable = []  # every key whose value cannot be read statically, reported at once
    for key, value in values.items():
        bare = key.lstrip("+")
        row = BY_KEY.get(bare)
        raw = str(imported.overrides.get(key, value))
        if key in dropped:
            # never exported as text (Hydra would read `${X}` as an interpolation, `$(date)` as a name) nor dropped
            # (a run name or a data file the export loses changes what runs): its value is asked for, unless nothing
            # is exported (`estimate`) and nothing modelled depends on it
            if bare != path_key and (exporting or (row is not None and row.field)):
                computed[bare] = raw
            elif bare != path_key:
                unresolved.append(f"{key} (computed by the shell: {raw}; not needed for an estimate)")
            continue
        if bare in NOT_IN_VERL:
            unresolved.append(f"{bare} ({NOT_IN_VERL[bare]}; dropped)")
            continue
        row = BY_KEY.get(bare)
        if row is None or bare in JOB_KEYS or bare in DEPRECATED_GLOBAL_MICRO or bare == "model_engine":
            if row is None and bare not in DEPRECATED_GLOBAL_MICRO:
                passthrough[bare] = value
            continue
        if row.field is None:
            if row.kind == "workload":
                passthrough[bare] = value  # held verbatim; export keeps the user's value
            elif bare.startswith(OTC):
                passthrough[bare] = value  # the user's recompute settings, kept while checkpointing stays on
            continue
        if (megatron and row.engines == frozenset({"fsdp", "fsdp2"}) and row.field != "actor_engine") or \
                (not megatron and row.engines == frozenset({"megatron"})):
            passthrough[bare] = value  # the other engine's key: this job's engine never reads it; kept as written
            continue
        if bare.startswith(OTC):
            passthrough[bare] = value
        if row.from_verl is not None:
            value = row.from_verl(value, bare_values)
        target = workload_changes if row.field in WORKLOAD_FIELDS else candidate_changes
        if value is None and target is candidate_changes:
            continue  # verl's null (a saved config's micro-batch keys under dynamic batching): the key is unset
        if row.field == "actor_engine":
            if not megatron:
                target[row.field] = value
            continue
        try:
            target[row.field] = _typed(row.field, key, value)
        except ConfigError as exc:
            unreadable.append((key, str(exc)))
            continue
        if target is candidate_changes:
            field_keys.setdefault(row.field, []).append((bare, values[key]))
    errors += [msg for _, msg in unreadable]
    errors += [f"{key}={raw} is not readable statically (computed by the shell)" for key, raw in computed.items()]
    if errors:
        asked = list(dict.fromkeys([*unparsed, *computed, *(key.lstrip("+") for key, _ in unreadable)]))
        remedy = f"rerun with their values after --: -- {' '.join(f'{k}=VALUE' for k in asked)}" if asked else ""
        if model is None:
            remedy += (" and " if remedy else "") + "pass --model (a Hugging Face id or a local model folder)"
        elif not asked:
            remedy = "give their values after --, e.g. -- KEY=VALUE"
        raise ConfigError(f"{imported.source}: cannot read {len(dict.fromkeys(errors))} key(s) statically, all of "
                          "them: " + "; ".join(dict.fromkeys(errors)) + f"; {remedy}")
    if megatron:
        # verl's Megatron defaults where the script is silent: no recompute (engine/megatron.yaml:75), expert TP
        # = TP (megatron.yaml:17 null; megatron-core uses TP)
        candidate_changes.setdefault("gradient_checkpointing", False)
        if f"{ARO}.actor.megatron.expert_tensor_parallel_size" not in bare_values:
            candidate_changes["actor_etp"] = candidate_changes.get("actor_tp", 1)
    gpn, nodes = values.get("trainer.n_gpus_per_node"), values.get("trainer.nnodes")
    sp = 1 if megatron else candidate_changes.get("ulysses_sp", 1)
    for key, field in DEPRECATED_GLOBAL_MICRO.items():
        if bare_values.get(key) is not None and isinstance(gpn, int):
            world = gpn * (nodes if isinstance(nodes, int) else 1)
            # per GPU = global / (GPUs / ulysses SP): workers/config/actor.py:238-241 (global * sp >= GPUs)
            candidate_changes.setdefault(field, max(int(bare_values[key]) * sp // world, 1))
    if "CUDA_DEVICE_MAX_CONNECTIONS" in imported.env and candidate_changes.get("actor_engine") == "megatron":
        candidate_changes.setdefault("cuda_device_max_connections", int(imported.env["CUDA_DEVICE_MAX_CONNECTIONS"]))
    if candidate_changes.get("actor_engine") != "megatron":
        candidate_changes["cuda_device_max_connections"] = 0
    if not candidate_changes.get("use_dynamic_bsz") and "ppo_micro_batch_size_per_gpu" not in candidate_changes:
        unresolved.append("actor.ppo_micro_batch_size_per_gpu (not set: verl refuses to start without it; the "
                          "baseline uses the quickstart's 4)")
    mml_key = f"{ARO}.rollout.max_model_len"
    if mml_key in bare_values and bare_values[mml_key] is None:
        # the user's own null: verl gives vLLM the model's whole context (vllm_async_server.py:1103-1105), which
        # the export then writes and the memory model prices (one full-context sequence of KV cache)
        if model.max_position_embeddings:
            workload_changes["max_model_len"] = model.max_position_embeddings
        else:
            unresolved.append(f"{mml_key}=null (verl uses the model's max_position_embeddings, unknown for "
                              f"{model.model_path} without its config.json; exported as prompt + response)")
    try:
        workload = replace(VERL_DEFAULT_WORKLOAD, **workload_changes)
        if workload.max_model_len == workload.seq_len:  # what autotune derives and exports anyway
            workload = replace(workload, max_model_len=None)
        # a knob that no row exports for this job (a ref.* knob under LoRA, where the reference runs on the actor)
        # is not part of the baseline: the user's key passes through verbatim, as verl reads (or ignores) it
        active = active_knobs_for(workload, candidate_changes.get("actor_engine", "fsdp"))
        for field in [f for f in candidate_changes if f in field_keys and f not in active and f != "actor_engine"]:
            del candidate_changes[field]
            passthrough.update(field_keys[field])
        if not model.is_moe:
            candidate_changes["actor_etp"] = 1  # no experts: expert TP does not apply
        baseline = Candidate(**candidate_changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{imported.source}: {exc}") from None
    base = Path.cwd() if cwd is None else Path(cwd)
    workload = replace(workload, train_files=absolute_files(workload.train_files, base),
                       val_files=absolute_files(workload.val_files, base))
    env = {k: v for k, v in (getattr(imported, "exported_env", None) or {}).items() if k not in ENV_KNOBS}
    return UserJob(source=imported.source, model=model,
                   gpus_per_node=gpn if isinstance(gpn, int) else None,
                   nodes=nodes if isinstance(nodes, int) else None, workload=workload, baseline=baseline,
                   passthrough=absolute_passthrough(passthrough, base), unresolved=tuple(unresolved),
                   notes=tuple(notes), env=env)
