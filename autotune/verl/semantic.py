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
- a key verl 0.9.1 no longer has (`NOT_IN_VERL`), which the user's job cannot carry either.

Anything else is a change of the training, and is reported as one line per key. Used by tests and
benchmarks; imports verl's Hydra config lazily (hydra-core and verl installed, even --no-deps).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

_ABSENT = "<absent>"


@dataclass(frozen=True)
class Difference:
    key: str
    user: object
    export: object

    def __str__(self) -> str:
        return f"{self.key}: your job {self.user!r}, export {self.export!r}"


def _flat(cfg, *, resolve: bool) -> dict:
    from omegaconf import OmegaConf

    out: dict = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    try:
        walk(OmegaConf.to_container(cfg, resolve=resolve), "")
    except Exception:  # an interpolation that cannot resolve (a user's ${...}): compare as written
        if not resolve:
            raise
        return _flat(cfg, resolve=False)
    return out


def _family(engine: str) -> str:
    return "megatron" if engine == "megatron" else "fsdp"


@functools.lru_cache(maxsize=2)
def engine_defaults(engine_family: str) -> dict:
    """verl's own composed defaults for one engine family, flattened and resolved."""
    from autotune.verl.compose import compose_overrides

    return _flat(compose_overrides(["model_engine=megatron"] if engine_family == "megatron" else []), resolve=True)


def user_job_args(imported) -> list[str]:
    """The user's job as verl's command line receives it: the script's overrides in order (later wins, as Hydra
    applies them), `model_engine=megatron` for verl's Megatron shim config, and each value the shell computes
    replaced by a marker no export can hold (so a key the export drops or rewrites shows as a difference)."""
    from autotune.verl.hydra_syntax import hydra_value
    from autotune.verl.keys import NOT_IN_VERL

    args = []
    if (imported.config_name or "").removesuffix(".yaml") == "ppo_megatron_trainer":
        args.append("model_engine=megatron")
    unresolved = set(imported.unresolved_keys)
    for key, value in imported.overrides.items():
        bare = key.lstrip("+~")
        if bare in NOT_IN_VERL:
            continue  # verl 0.9.1 refuses the key itself ("Could not override"): no job carries it
        if key.startswith("~"):
            args.append(key if not value else f"{key}={value}")
        elif key in unresolved or "$(" in value or "`" in value:
            args.append(f"{key}={hydra_value(f'<computed by the shell: {value}>')}")
        else:
            args.append(f"{key}={value}")
    return args


def compare(user_cfg, export_cfg, *, user_engine: str, export_engine: str, gpus_per_node: int, nodes: int,
            tuned_workload_keys: frozenset = frozenset()) -> list[Difference]:
    """Every difference between the two composed configs that no declared rule explains."""
    from autotune.verl.engines import ENGINE_DEFAULT_DIFFERENCES, SPEED_ONLY_ENGINE_KEYS, speed_only
    from autotune.verl.keys import ADDED_KEYS, TABLE

    system = {row.verl_key for row in TABLE if row.kind in ("knob", "derived")} | set(ADDED_KEYS)
    job_shape = {"trainer.n_gpus_per_node": gpus_per_node, "trainer.nnodes": nodes}
    user_raw, export_raw = _flat(user_cfg, resolve=False), _flat(export_cfg, resolve=False)
    user, export = _flat(user_cfg, resolve=True), _flat(export_cfg, resolve=True)
    switch = _family(user_engine) != _family(export_engine)
    user_defaults, export_defaults = engine_defaults(_family(user_engine)), engine_defaults(_family(export_engine))
    out = []
    for key in sorted(set(user) | set(export)):
        u, e = user.get(key, _ABSENT), export.get(key, _ABSENT)
        if u == e or user_raw.get(key, _ABSENT) == export_raw.get(key, _ABSENT):
            continue
        if key in system or key in tuned_workload_keys:
            continue
        if key in job_shape:
            if e != job_shape[key]:
                out.append(Difference(key, u, e))
            continue
        if switch:
            user_side_default = u == user_defaults.get(key, _ABSENT)
            export_side_default = e == export_defaults.get(key, _ABSENT)
            if key in ENGINE_DEFAULT_DIFFERENCES and user_side_default and export_side_default:
                continue
            only_user_engine = key not in export_defaults and key in user_defaults
            only_export_engine = key not in user_defaults and key in export_defaults
            if (only_user_engine and (user_side_default or speed_only(key)) and e == _ABSENT) or \
                    (only_export_engine and export_side_default and u == _ABSENT):
                continue
            if key in SPEED_ONLY_ENGINE_KEYS and e == _ABSENT:
                continue
        out.append(Difference(key, u, e))
    return out
