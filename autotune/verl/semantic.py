"""The semantic judge: is an export the *same training* as the user's job?

verl's own validate_config (autotune/verl/judge.py) says whether an export is accepted; this module says whether it
learns what the user's job learns. Both are composed with verl 0.9.1's Hydra config exactly as verl receives
them (the user's job: its command-line overrides; the export: the overrides a probe and best.yaml carry), and
the whole composed configs are compared leaf by leaf. A difference is explained only by:

- a searched knob, or what autotune derives from one (autotune/verl/keys.py rows of kind knob / derived);
- the job's shape (`trainer.n_gpus_per_node`, `trainer.nnodes`), which must equal the run's;
- a workload knob the user opted in to tune;
- an engine switch (FSDP <-> Megatron), by the declared rules of autotune/verl/engines.py: a key only one
  engine's config declares is that engine's own setting, and carries nothing of the job while it holds that
  engine's default; a key both declare with different defaults is in `ENGINE_DEFAULT_DIFFERENCES`; a user's
  setting the switch drops must be in `SPEED_ONLY_ENGINE_KEYS`;
- a key verl 0.9.1 no longer has (`NOT_IN_VERL`), which the user's job cannot carry either;
- a local path made absolute (`~` expanded, a relative one against the folder the job is started from,
  autotune/verl/paths.py): the same file, which verl then finds from a probe's folder too.

Anything else is a change of the training, and is reported as one line per key. Used by tests and
benchmarks; imports verl's Hydra config lazily (hydra-core and verl installed, even --no-deps).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

_ABSENT = "<absent>"


@dataclass(frozen=True)
class Difference:
    key: str
    user: object
    export: object

    def __str__(self) -> str:
        return f"{self.key}: your job {self.user!r}, export {self.export!r}"


def _leaves(node, prefix: str = "", out: dict | None = None) -> dict:
    out = {} if out is None else out
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _leaves(v, f"{prefix}{k}.", out)
    else:
        out[prefix[:-1]] = node
    return out


def _flat(cfg) -> tuple[dict, dict]:
    """(as written, resolved) leaves of a composed config by dotted key. An interpolation to a section resolves to
    that section's leaves; where some interpolation cannot resolve (a user's own ${...}), each leaf is resolved on
    its own and one that cannot is compared as written."""
    from omegaconf import OmegaConf

    raw = _leaves(OmegaConf.to_container(cfg, resolve=False))
    try:
        return raw, _leaves(OmegaConf.to_container(cfg, resolve=True))
    except Exception:  # omegaconf raises InterpolationResolutionError and friends
        pass
    resolved = {}
    for key, value in raw.items():
        if isinstance(value, str) and "${" in value:
            try:
                value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
                value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            except Exception:  # omegaconf raises InterpolationResolutionError and friends
                pass
        resolved[key] = value
    return raw, resolved


@functools.lru_cache(maxsize=2)
def engine_defaults(engine_family: str) -> tuple[dict, dict]:
    """verl's own composed defaults for one engine family: (as written, resolved) leaves."""
    from autotune.verl.compose import compose_overrides

    return _flat(compose_overrides(["model_engine=megatron"] if engine_family == "megatron" else []))


def user_job_args(imported, engine: str) -> list[str]:
    """The user's job as verl's command line receives it: the script's overrides in order (later wins, as Hydra
    applies them), with each value the shell computes replaced by a marker no export can hold (so a key the export
    drops or rewrites shows as a difference). Three readings, as the export writes the same keys: a `+key` is
    applied as `++key` (verl's Hydra refuses the `+` where the key is already there), a key verl does not declare
    as `++key` (refused without a prefix: "Could not override"), and a job read as Megatron (`engine`) from
    `actor.strategy=megatron` composes with `model_engine=megatron`. Keys verl 0.9.1 no longer has are left out:
    no job carries them."""
    from autotune.verl.export import verl_declared_keys
    from autotune.verl.hydra_syntax import hydra_value
    from autotune.verl.keys import NOT_IN_VERL

    declared = verl_declared_keys("megatron" if engine == "megatron" else "dp") or frozenset()
    args = ["model_engine=megatron"] if engine == "megatron" else []
    unresolved = set(imported.unresolved_keys)
    for key, value in imported.overrides.items():
        bare = key.lstrip("+~")
        if bare in NOT_IN_VERL or key == "model_engine":
            continue
        computed = key in unresolved  # bash could not read it (the prefix below changes the key's spelling only)
        if key.startswith("+") and not key.startswith("++"):
            key = "+" + key  # as the export writes it (export.hydra_overrides): Hydra's `+` fails on a declared key
        elif not key.startswith(("+", "~")) and key not in declared:
            key = "++" + key  # a key verl 0.9.1 does not declare: refused without a `+`, added as the export adds it
        if key.startswith("~"):
            args.append(key if not value else f"{key}={value}")
        elif computed:
            args.append(f"{key}={hydra_value(f'<computed by the shell: {value}>')}")
        else:
            args.append(f"{key}={value}")
    return args


def compare(user_cfg, export_cfg, *, user_engine: str, export_engine: str, gpus_per_node: int, nodes: int,
            tuned_workload_keys: frozenset = frozenset()) -> list[Difference]:
    """Every difference between the two composed configs that no declared rule explains."""
    from autotune.verl.engines import ENGINE_DEFAULT_DIFFERENCES, family, read_only_by, speed_only
    from autotune.verl.keys import ADDED_KEYS, DEPRECATED_GLOBAL_MICRO, TABLE
    from autotune.verl.paths import absolute_files, is_path_key

    # the deprecated global micro-batch keys are the same knob as the per-GPU ones the export writes
    system = {row.verl_key for row in TABLE if row.kind in ("knob", "derived")} | set(ADDED_KEYS) \
        | set(DEPRECATED_GLOBAL_MICRO)
    job_shape = {"trainer.n_gpus_per_node": gpus_per_node, "trainer.nnodes": nodes}
    (user_raw, user), (export_raw, export) = _flat(user_cfg), _flat(export_cfg)
    switch = family(user_engine) != family(export_engine)
    user_defaults, export_defaults = engine_defaults(family(user_engine)), engine_defaults(family(export_engine))

    def at_default(defaults: tuple[dict, dict], key: str, raw, resolved) -> bool:
        # as written (verl's own interpolation, following a knob) or by value
        return raw == defaults[0].get(key, _ABSENT) or resolved == defaults[1].get(key, _ABSENT)

    out: list[Difference] = []
    for key in sorted(set(user) | set(export)):
        u, e = user.get(key, _ABSENT), export.get(key, _ABSENT)
        if switch and read_only_by(key) == family(user_engine) and key not in system \
                and not at_default(user_defaults, key, user_raw.get(key, _ABSENT), u):
            out.append(Difference(key, u, f"{e!r}, which {family(export_engine)} does not read"))
            continue
        if u == e or user_raw.get(key, _ABSENT) == export_raw.get(key, _ABSENT):
            continue
        if key in system or key in tuned_workload_keys:
            continue
        if is_path_key(key) and e == absolute_files(list(u) if isinstance(u, tuple) else u, Path.cwd()):
            continue  # the same file, as an absolute path
        if key in job_shape:
            if e != job_shape[key]:
                out.append(Difference(key, u, e))
            continue
        if switch:
            user_side_default = at_default(user_defaults, key, user_raw.get(key, _ABSENT), u)
            export_side_default = at_default(export_defaults, key, export_raw.get(key, _ABSENT), e)
            if key in ENGINE_DEFAULT_DIFFERENCES and user_side_default and export_side_default:
                continue
            only_user_engine = key not in export_defaults[1] and key in user_defaults[1]
            only_export_engine = key not in user_defaults[1] and key in export_defaults[1]
            if (only_user_engine and user_side_default and e == _ABSENT) or \
                    (only_export_engine and export_side_default and u == _ABSENT) or (speed_only(key) and e == _ABSENT):
                continue
        out.append(Difference(key, u, e))
    return out


def judge_exports(imported, job, candidates, *, gpus_per_node: int, nodes: int, composer=None) -> list[tuple]:
    """(candidate, differences, composed export) for each candidate's export against the user's job `imported` (an
    ImportedJob, with any `--` values applied) as autotune read it (`job`, a UserJob)."""
    from autotune.verl.export import hydra_overrides, model_engine, verl_overrides
    from autotune.verl.judge import COMPOSER, interpolation_parses_cached

    compose = composer or COMPOSER
    user_engine = job.baseline.actor_engine
    out = []
    with interpolation_parses_cached():
        user_cfg = compose(user_job_args(imported, user_engine))
        for candidate in candidates:
            overrides = verl_overrides(job.model, job.workload, candidate, gpus_per_node=gpus_per_node, nodes=nodes,
                                       passthrough=job.passthrough)
            export_cfg = compose(hydra_overrides(overrides, model_engine(candidate)))
            out.append((candidate, compare(user_cfg, export_cfg, user_engine=user_engine,
                                           export_engine=candidate.actor_engine, gpus_per_node=gpus_per_node,
                                           nodes=nodes), export_cfg))
    return out
