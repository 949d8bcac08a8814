"""A study starts from what earlier studies learned on the same kind of node, and leaves what it learned
(storage/node_profile.py holds the files; issue 29 item 4).

At the start the study stores the profile it starts from (PROFILE_ATTR: per phase the median log of measured
over predicted seconds and its spread, the memory model's under-prediction on the node, or why there is none), so its
model is the same on resume whatever the file holds by then. The corrected model (search/learned.py) starts each
phase's residual at the profile's median instead of at 0 with a prior as wide as the node's spread, the warm start
ranks with the profile's phase factors, and the memory gate (search/prescreen.py) scales its predictions by the
profile's under-prediction from the first candidate. At the end the study's own measured probes go into the profile
for the next study.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config import TuneConfig
from autotune.model.cost import MODEL_REVISION
from autotune.search.learned import base_prediction
from autotune.spaces.candidate import Candidate
from autotune.storage.node_profile import (PROFILE_ATTR, PROFILE_ROWS, NodeKind, detect_kind, profile_row,
                                           record_study, summary_for)
from autotune.storage.records import MAX_UNDER, peak_over_predicted, records
from autotune.storage.results import measured_workload, workload_of
from autotune.storage.tuning_cost import launch_overhead_s
from autotune.storage.urls import redact


def start_profile(study: optuna.Study, cfg: TuneConfig) -> dict:
    """The profile this study starts from, stored once (a resumed study keeps the one it started with)."""
    stored = study.user_attrs.get(PROFILE_ATTR)
    if stored is not None:
        return stored
    kind = detect_kind(cfg.backend, cfg.passthrough)
    if kind is None:
        summary = {"none": "the sim measures nothing" if cfg.backend == "sim" else "no NVIDIA GPU detected here"}
    else:
        summary = summary_for(kind, "the first study on this kind of node", cfg.vllm_eager)
    study.set_user_attr(PROFILE_ATTR, summary)
    return summary


def _measured_probes(study: optuna.Study, cfg: TuneConfig):
    """(user attrs, the uncorrected model's answer) of each of this study's measured probes, priced by this autotune's
    model at the prompt and response lengths the probe measured (storage/results.measured_workload), so that a
    residual in the profile is the node's and not this job's length error (the workload's lengths are assumptions;
    the next job's differ); simulated ones and copies of another trial's measurement are left out."""
    identity = study.user_attrs["identity"]
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        attrs = t.user_attrs
        if attrs.get("state") != "measured" or attrs.get("simulated") or attrs.get("duplicate_of") is not None \
                or "candidate" not in attrs:
            continue
        workload = measured_workload(workload_of(identity, attrs), attrs)
        yield attrs, base_prediction(cfg, Candidate.from_params(attrs["candidate"]), workload)


def study_rows(study: optuna.Study, cfg: TuneConfig) -> tuple[dict[str, list[float]], list[float], int]:
    """(per profile row the log of measured over predicted seconds, the step's seconds outside its phases, probes) of
    this study's measured probes (_measured_probes). A row is a phase, gen apart for eager decoding
    (storage/node_profile.profile_row)."""
    phases: dict[str, list[float]] = {}
    others: list[float] = []
    probes = 0
    for attrs, base in _measured_probes(study, cfg):
        measured = attrs.get("phase_s") or {}
        if not measured:
            continue
        probes += 1
        for phase, predicted_s in base.phase_s.items():
            seconds = measured.get(phase)
            if predicted_s > 0 and seconds and seconds > 0:
                phases.setdefault(profile_row(phase, cfg.vllm_eager), []).append(math.log(seconds / predicted_s))
        step_s = attrs.get("step_s")
        timed = sum(v for k, v in measured.items() if k in base.phase_s)
        if step_s and step_s >= timed:
            others.append(step_s - timed)
    return phases, others, probes


def study_peaks(study: optuna.Study, cfg: TuneConfig) -> list[float]:
    """Measured over predicted GPU peak of each of this study's measured probes (_measured_probes: the prediction this
    autotune's memory model makes, as study_rows prices the phases), readings above MAX_UNDER left out: the gate caps
    them within a study, but they are readings over more than the probe's own steps (the H200 shared study's first
    configuration read x1.45, its whole launch's peak), not the node's, and a profile carries them to every later
    job."""
    ratios = []
    for attrs, base in _measured_probes(study, cfg):
        over = peak_over_predicted(attrs.get("peak_mem_gib"), base.peak_gib)
        if over is not None and math.isfinite(over) and over <= MAX_UNDER:
            ratios.append(over)
    return ratios


def study_id(study: optuna.Study, storage_url: str) -> str:
    """A study's name in a profile: its name and where it is stored (two out folders may hold equal names)."""
    return f"{study.study_name}@{hashlib.sha256(redact(storage_url).encode()).hexdigest()[:8]}"


def record_profile(study: optuna.Study, cfg: TuneConfig) -> Path | None:
    """Leave this study's measured probes in its node kind's profile; the profile's file, or None (no kind, a node
    of another kind than the study started on, no measured probe, or a folder that cannot be written)."""
    summary = study.user_attrs.get(PROFILE_ATTR) or {}
    if "kind" not in summary:
        return None
    # a study resumed on a node of another kind (a new driver, torch, vLLM or verl; another GPU is refused by the
    # study's identity) holds probes of two kinds: none of them is filed under either
    stored, here = NodeKind(**summary["kind"]), detect_kind(cfg.backend, cfg.passthrough)
    if here is None or replace(here, model=stored.model, rows=stored.rows) != stored:
        return None
    phases, others, probes = study_rows(study, cfg)
    if not probes:
        return None
    overhead_s = launch_overhead_s(records(study))
    # study_rows prices every probe with this autotune's time model and keys it this autotune's way, so the rows
    # belong under its revision even when the study started under an older one (resumed after an upgrade); the
    # node's own fields are the study's
    kind = replace(stored, model=MODEL_REVISION, rows=PROFILE_ROWS)
    return record_study(kind, study_id(study, cfg.storage_url), phases, others, probes, overhead_s,
                        peak_over_predicted=study_peaks(study, cfg))
