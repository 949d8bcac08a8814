"""From (workload, candidate) to verl 0.9.1 Hydra keys, generated from the key table (autotune/verl/keys.py), and
the best.yaml writer.

The same overrides feed a probe's command line (verl backend) and the exported best.yaml, so what was
probed is what is exported. tests/verl/test_judge.py runs verl's own start-up checks on them; keys removed in
0.9.x (Megatron grad_offload) are never emitted.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import re
import shlex
from pathlib import Path

import yaml

from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.verl.hydra_syntax import hydra_value
from autotune.verl.engines import engine_own, family
from autotune.verl.keys import ADDED_KEYS, KNOB_PACKAGES, OTC, TABLE, Job
from autotune.verl.pipeline_split import Split, split_error
from autotune.workload import Workload

VERL_CONFIG_SEARCHPATH = "pkg://verl.trainer.config"
_RECOMPUTE_KEYS = tuple(f"{OTC}.{leaf}" for leaf in ("recompute_granularity", "recompute_method",
                                                      "recompute_num_layers", "recompute_modules"))
_SPLIT_KEYS = dict(zip(Split._fields, (f"{OTC}.{leaf}" for leaf in (
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"))))


def _users_split_holds(user: dict, model: ModelSpec, candidate: Candidate) -> bool:
    """The user's own pipeline split (uneven stages, account_for_*) is kept where Megatron builds it for this
    candidate (their own layout); elsewhere it is dropped, and autotune's split applies."""
    if not any(key in user for key in _SPLIT_KEYS.values()):
        return False
    split = Split(**{f: user.get(key, default) for (f, key), default in zip(_SPLIT_KEYS.items(), Split())})
    return split_error(model.num_layers, candidate.actor_pp, candidate.actor_vpp, split) is None


def _rows(job: Job, kinds: tuple[str, ...]) -> dict:
    return {k.verl_key: k.value(job) for k in TABLE
            if k.kind in kinds and k.verl_key != "model_engine" and (k.field or k.to_verl) and k.applies(job)}


def workload_overrides(model: ModelSpec, workload: Workload, *, gpus_per_node: int, nodes: int,
                       candidate: Candidate | None = None) -> dict:
    """The user's job: held fixed by the tuner, emitted so the export runs the same workload."""
    job = Job(workload, candidate or Candidate(), model.model_path, gpus_per_node, nodes)  # the user's exact string
    return _rows(job, ("workload", "job"))


def candidate_overrides(c: Candidate, workload: Workload | None = None) -> dict:
    """The speed/memory knobs the study chose, and what verl needs consistent with them, as verl keys."""
    job = Job(workload or Workload(), c, "", 0, 0)
    return _rows(job, ("knob", "derived"))


def verl_overrides(model: ModelSpec, workload: Workload, candidate: Candidate, *, gpus_per_node: int,
                   nodes: int, passthrough: dict | None = None) -> dict:
    """The user's other keys first (unchanged), then the workload, then the chosen system knobs.

    Generated from the key table (autotune/verl/keys.py). The user's keys of the engine the candidate does not
    run are dropped (verl's config dataclasses refuse them); the user's own Megatron recompute settings are kept
    while checkpointing stays on."""
    user = {k: v for k, v in (passthrough or {}).items() if engine_own(k) in (None, family(candidate.actor_engine))}
    users_split = _users_split_holds(user, model, candidate)
    if not users_split:  # the user's split does not fit this layout: autotune's, with account_for_* off
        user = {k: (False if k.startswith(f"{OTC}.account_for_") else v) for k, v in user.items()
                if k not in _SPLIT_KEYS.values() or k.startswith(f"{OTC}.account_for_")}
    out = dict(user)
    job = Job(workload, candidate, model.model_path, gpus_per_node, nodes, model.num_layers)
    user_recompute = candidate.is_megatron and candidate.gradient_checkpointing and \
        user.get(f"{OTC}.recompute_granularity") is not None
    for key in TABLE:
        if key.verl_key == "model_engine" or not (key.field or key.to_verl) or not key.applies(job):
            continue
        if key.user_wins and key.verl_key in user:
            continue  # the user's own value (a local model folder, another estimator or rollout engine)
        if user_recompute and key.verl_key in _RECOMPUTE_KEYS:
            continue
        if users_split and key.verl_key in _SPLIT_KEYS.values():
            continue
        out[key.verl_key] = key.value(job)
    return out


def model_engine(candidate: Candidate) -> str:
    """verl's Hydra group: `model_engine=megatron` selects the Megatron actor/ref configs."""
    return "megatron" if candidate.is_megatron else "dp"


@functools.lru_cache(maxsize=4)
def verl_declared_keys(engine: str) -> frozenset[str] | None:
    """Every dotted key of verl's ppo_trainer composed for `engine` (the optimizer and engine sections differ), or
    None where verl's configs are not installed."""
    try:
        from omegaconf import OmegaConf

        from autotune.verl.compose import compose_overrides
        engine_args = [f"model_engine={engine}"] if engine != "dp" else []
        config = OmegaConf.to_container(compose_overrides(engine_args), resolve=False)
    except Exception:  # verl or hydra missing: only autotune's own added keys are known
        return None
    keys: set[str] = set()

    def walk(node, prefix: str) -> None:
        for k, v in node.items():
            keys.add(prefix + str(k))
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
    walk(config, "")
    return frozenset(keys)


def hydra_overrides(overrides: dict, engine: str) -> list[str]:
    """Command-line form: `key=value`, `++key=value` for the keys verl does not declare (Hydra refuses a plain
    override of an undeclared key: "Could not override"; `++` adds it, or sets it where an interpolation already
    put it there, where `+` fails with "Could not append to config": a user's `+ref.megatron.
    override_transformer_config.X` after the actor's, which the ref's section interpolates). A user's own `+key`
    (passed through) is found by looking the key up in verl's config where it is installed."""
    declared = verl_declared_keys(engine)
    args = [f"model_engine={engine}"] if engine != "dp" else []
    for key, value in overrides.items():
        added = key in ADDED_KEYS or (declared is not None and key not in declared)
        args.append(f"{'++' if added else ''}{key}={hydra_value(value)}")
    return args


def nest(flat: dict) -> dict:
    root: dict = {}
    for key, value in flat.items():
        node = root
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


def best_yaml_text(overrides: dict, engine: str, header: list[str]) -> str:
    """A Hydra primary config: verl's ppo_trainer as default, then only what autotune sets."""
    defaults: list = ["ppo_trainer"]
    if engine != "dp":
        defaults.append({"override model_engine": engine})
    defaults.append("_self_")
    body = nest(overrides)
    # a user's hydra.* keys (hydra.run.dir=...) join the hydra block; verl's config search path stays in it,
    # or `--config-name=best` could not find ppo_trainer
    hydra = body.pop("hydra", {})
    searchpath = hydra.get("searchpath") or []
    searchpath = list(searchpath) if isinstance(searchpath, (list, tuple)) else [searchpath]
    hydra["searchpath"] = searchpath + [VERL_CONFIG_SEARCHPATH] * (VERL_CONFIG_SEARCHPATH not in searchpath)
    doc = {"hydra": hydra, "defaults": defaults}
    doc.update(body)
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + body


# best.yaml's first line: the SHA-256 of the rest of the file as autotune wrote it, so that a hand edit is told from
# autotune's own file and is never overwritten (edited_by_hand)
SIGNATURE = "# autotune-sha256: "


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def signed(text: str) -> str:
    return f"{SIGNATURE}{_digest(text)} (of the lines below; after a hand edit autotune keeps this file)\n{text}"


def edited_by_hand(path: Path) -> bool:
    """True when `path` exists and is not, byte for byte, a file autotune wrote (a hand edit, another tool's file, an
    export of an autotune that wrote no signature)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        return True  # unreadable as autotune writes it: not autotune's to replace
    first, _, rest = text.partition("\n")
    return not (first.startswith(SIGNATURE) and first[len(SIGNATURE):].split(" ", 1)[0] == _digest(rest))


def set_aside(path: Path) -> Path:
    """Move a hand-edited best.yaml beside itself (best.edited.yaml, best.edited-2.yaml, ...), never over a file."""
    path = Path(path)
    for n in range(1, 1000):
        target = path.with_name(f"{path.stem}.edited{'' if n == 1 else f'-{n}'}{path.suffix}")
        if not target.exists():
            path.replace(target)
            return target
    raise OSError(f"no free name beside {path} to keep the hand-edited file")


def write_best_yaml(path: Path, overrides: dict, engine: str, header: list[str]) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".yaml.tmp")
    try:
        tmp.write_text(signed(best_yaml_text(overrides, engine, header)))
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no empty best.yaml.tmp behind
        raise
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def _model_line(model: ModelSpec, exported_model_path: str | None) -> str:
    """The model.path the export runs; where --model named other shapes (a random-weight folder with a known
    model's shapes, say), those too, so the header never names another model than the one trained."""
    path = exported_model_path or model.model_path
    return path if path == model.model_path else f"{path} (shapes of {model.model_path})"


def export_header(*, model: ModelSpec, gpu_name: str, gpus_per_node: int, nodes: int, backend: str,
                  simulated: bool, study: str, trial: int, tokens_per_s_per_gpu: float, mfu: float | None,
                  peak_mem_gib: float, baseline_tokens_per_s_per_gpu: float | None,
                  tuned_workload_knobs: tuple[str, ...], config_dir: Path, baseline_label: str = "verl default",
                  baseline_trial: int | None = None, verl_default_tokens_per_s_per_gpu: float | None = None,
                  exported_model_path: str | None = None, holds=(), env: dict | None = None,
                  candidate: Candidate | None = None) -> list[str]:
    kind = "SIMULATED by the calibrated model, not measured" if simulated else f"measured by the {backend} backend"
    lines = [
        "autotune export: verl 0.9.1 GRPO configuration",
        f"model: {_model_line(model, exported_model_path)}; GPUs: {nodes} node(s) x {gpus_per_node} {gpu_name}",
        f"study: {study}, trial {trial}; backend: {backend}; simulated: {str(simulated).lower()}",
        f"score ({kind}): {tokens_per_s_per_gpu:.1f} tokens/s/GPU, actor MFU "
        f"{'n/a' if mfu is None else f'{mfu:.3f}'}, peak memory {peak_mem_gib:.1f} GiB",
    ]
    if baseline_tokens_per_s_per_gpu:
        gain = tokens_per_s_per_gpu / baseline_tokens_per_s_per_gpu
        trial_text = "" if baseline_trial is None else f" (trial {baseline_trial})"
        lines.append(f"baseline, {baseline_label}{trial_text}: {baseline_tokens_per_s_per_gpu:.1f} tokens/s/GPU; "
                     f"this configuration x{gain:.2f}")
    if verl_default_tokens_per_s_per_gpu:
        lines.append(f"verl's default configuration: {verl_default_tokens_per_s_per_gpu:.1f} tokens/s/GPU; this "
                     f"configuration x{tokens_per_s_per_gpu / verl_default_tokens_per_s_per_gpu:.2f}")
    if tuned_workload_knobs:
        lines.append("WORKLOAD CHANGED (opted in): " + ", ".join(tuned_workload_knobs)
                     + " were tuned; the model may learn differently than with your values")
    else:
        lines.append("workload held fixed: batch sizes, rollout.n, lengths and algorithm are yours")
    lines += [hold.describe() for hold in holds]
    lines += env_lines(env or {})
    for knob, package in KNOB_PACKAGES.items():
        if candidate is not None and getattr(candidate, knob, False):
            name = package.replace("_", "-")
            lines.append(f"{knob}: true needs the {name} package where verl runs (`pip install {name}`); verl "
                         "imports it at start-up")
    lines += [
        f"exported {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"run: python3 -m verl.trainer.main_ppo --config-path={Path(config_dir).resolve()} --config-name=best",
    ]
    return lines


ENV_NOTE = ("environment your launch script exports, which this job needs (`autotune train` sets it; to run verl "
            "directly, run these lines first):")
_ENV_LINE = re.compile(r"# export ([A-Za-z_][A-Za-z0-9_]*)=(.*)")


def env_lines(env: dict) -> list[str]:
    """The job's environment as shell lines in best.yaml's header: a note a person can paste, and what
    `autotune train` reads back (header_env)."""
    if not env:
        return []
    return [ENV_NOTE] + [f"export {name}={shlex.quote(str(value))}" for name, value in env.items()]


def header_env(text: str) -> dict[str, str]:
    """The `# export NAME=VALUE` lines of a best.yaml's leading comment block."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break  # the header ends at the first line of YAML
        match = _ENV_LINE.fullmatch(line.rstrip())
        if match:
            try:
                words = shlex.split(match.group(2))
            except ValueError:
                continue  # an unbalanced quote from a hand edit: not an assignment autotune wrote
            env[match.group(1)] = words[0] if words else ""
    return env
