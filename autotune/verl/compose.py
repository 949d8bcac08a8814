"""Compose configs with verl's own Hydra config (verl installed, even --no-deps, next to hydra-core).

This is the proof that an export is accepted by verl: Hydra rejects unknown override keys with
"Could not override ...". verl's package is located without importing it (its __init__ imports ray).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autotune.errors import BackendUnavailable, ConfigError


def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable("verl is not installed; `pip install --no-deps verl==0.9.1 hydra-core` is enough "
                                 "to validate configs")
    path = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"
    if not (path / "ppo_trainer.yaml").is_file():
        raise BackendUnavailable(f"verl at {path.parent.parent} has no trainer/config/ppo_trainer.yaml (need verl 0.9.x)")
    return path


def _hydra():
    try:
        from hydra import compose, initialize_config_dir
    except ImportError:
        raise BackendUnavailable("hydra-core is not installed; pip install hydra-core") from None
    return compose, initialize_config_dir


def compose_overrides(overrides: list[str]):
    """verl's ppo_trainer with these command-line overrides, as verl's main_ppo would compose it."""
    compose, initialize_config_dir = _hydra()
    from hydra.errors import HydraException
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        try:
            return compose(config_name="ppo_trainer", overrides=list(overrides))
        except HydraException as exc:
            raise ConfigError(f"verl rejected the config: {str(exc).splitlines()[0]}") from None


def compose_exported(best_yaml: Path, overrides: list[str] = ()):
    """Compose an exported best.yaml the way `main_ppo --config-path DIR --config-name best` does.

    The file's searchpath `pkg://verl.trainer.config` imports verl (and ray); here it is pointed at the
    same folder on disk so composition works without verl's runtime dependencies.
    """
    compose, initialize_config_dir = _hydra()
    from hydra.errors import HydraException
    best_yaml = Path(best_yaml).resolve()
    with initialize_config_dir(config_dir=str(best_yaml.parent), version_base=None):
        try:
            return compose(config_name=best_yaml.stem,
                           overrides=[f"hydra.searchpath=[file://{verl_config_dir()}]", *overrides])
        except HydraException as exc:
            raise ConfigError(f"verl rejected {best_yaml.name}: {str(exc).splitlines()[0]}") from None


def select(cfg, dotted_key: str):
    from omegaconf import OmegaConf
    return OmegaConf.select(cfg, dotted_key, throw_on_missing=False)


class Composer:
    """Compose many override lists fast: Hydra builds each config-group choice's defaults tree once, then
    applies each list's key=value overrides with its own `_apply_overrides_to_config`, the step
    `compose()` ends with (hydra/_internal/config_loader_impl.py:336). Same result, ~30x faster."""

    def __init__(self) -> None:
        self._bases: dict[tuple[str, ...], bytes] = {}

    def __call__(self, overrides: list[str]):
        import pickle

        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException
        from omegaconf import OmegaConf

        groups = tuple(o for o in overrides if o.split("=", 1)[0] == "model_engine")
        if groups not in self._bases:
            # kept pickled: a fresh copy per call is pickle.loads, ~3x faster than deepcopy of a DictConfig (76 ms
            # per candidate for verl's ppo_trainer); OmegaConf pickles a config with its flags
            # (omegaconf/basecontainer.py:120-144), and benchmarks/verl_judge_speed.py compares the results with
            # compose()'s
            self._bases[groups] = pickle.dumps(compose_overrides(list(groups)))
        cfg = pickle.loads(self._bases[groups])
        rest = [o for o in overrides if o not in groups]
        try:
            parsed = OverridesParser.create().parse_overrides(rest)
            OmegaConf.set_struct(cfg, True)
            ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
        except HydraException as exc:
            raise ConfigError(f"verl rejected the config: {str(exc).splitlines()[0]}") from None
        return cfg
