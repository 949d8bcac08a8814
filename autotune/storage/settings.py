"""The search settings a study was started with, stored on it so that `autotune worker` on another node
searches the same space (pinned knobs, narrowed ranges, opted-in workload knobs, probe steps, objective).

The identity (driver.study_identity) says which job a study is for; these say how it is searched. A
worker with other ranges would ask Optuna for a different categorical choice list under the same name,
which Optuna refuses ("dynamic value space", reference/optuna-ray.md section 1), or would silently
search another space.
"""

from __future__ import annotations

from dataclasses import asdict

import optuna

from autotune.config import ProbeBudget, SearchOptions, TuneConfig
from autotune.errors import ConfigError

ATTR = "search_settings"


def search_settings(cfg: TuneConfig) -> dict:
    """JSON-able settings for `study.set_user_attr(ATTR, ...)` when the study is created."""
    return {"fixed": dict(cfg.fixed), "ranges": dict(cfg.ranges), "tune_workload": list(cfg.tune_workload),
            "probe": asdict(cfg.probe), "search": asdict(cfg.search)}


def settings_kwargs(doc: dict) -> dict:
    """TuneConfig keyword arguments from a stored settings document."""
    try:
        return {"fixed": dict(doc.get("fixed") or {}), "ranges": dict(doc.get("ranges") or {}),
                "tune_workload": tuple(doc.get("tune_workload") or ()),
                "probe": ProbeBudget(**(doc.get("probe") or {})), "search": SearchOptions(**(doc.get("search") or {}))}
    except TypeError as exc:
        raise ConfigError(f"the study's stored {ATTR} are not readable by this autotune version: {exc}") from None


def stored_settings(study: optuna.Study) -> dict | None:
    doc = study.user_attrs.get(ATTR)
    return settings_kwargs(doc) if doc is not None else None
