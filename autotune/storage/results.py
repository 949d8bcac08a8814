"""Summaries of a stored study: result.json, the best-trials table, and best.yaml export."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, fields, replace
from pathlib import Path

import optuna

from autotune.errors import ConfigError
from autotune.hardware import get_gpu
from autotune.models import model_from_identity
from autotune.spaces.candidate import Candidate
from autotune.storage.changes import changes_doc
from autotune.storage.noise import measured_noise, score_noise, speedup_interval
from autotune.storage.tuning_cost import payback, planned_steps, tuning_cost
from autotune.verl.engines import holds
from autotune.verl.metrics import PROMPT_MEAN_KEY, RESPONSE_MEAN_KEY
from autotune.verl.export import (edited_by_hand, export_header, model_engine, set_aside, verl_overrides,
                                  write_best_yaml)
from autotune.storage.records import (POSTERIOR_ATTR, TIE_FRACTION, TrialRecord, baseline_label, baseline_record,
                                      best_records, pareto_front, ranking_score, records, tied_with_fastest,
                                      measured_under_prediction, verl_default_record)
from autotune.storage.urls import redact
from autotune.workload import Workload


def identity_of(study: optuna.Study) -> dict:
    identity = study.user_attrs.get("identity")
    if not identity:
        raise ConfigError(f"study {study.study_name!r} was not created by autotune (no identity attribute)")
    return identity


def workload_of(identity: dict, trial_attrs: dict | None = None) -> Workload:
    known = {f.name for f in fields(Workload)}
    values = {k: v for k, v in identity["workload"].items() if k in known}
    values.update((trial_attrs or {}).get("workload_tuned") or {})
    return Workload(**values)


def measured_workload(workload: Workload, trial_attrs: dict) -> Workload:
    """`workload` at the prompt and response means verl measured over this probe's timed steps (the medians of its
    prompt_length/mean and response_length/mean, kept in the trial's series), where it logged them; else as it is.

    The workload's lengths are assumptions (prompt_fill 0.4 of the prompt cap, responses at the cap unless the user
    says otherwise) and the training passes are priced by the tokens, so a residual against them holds the job's
    length error as well as the node's: on one H100 the recipe's jobs measured prompts of 70-75 tokens where 0.4 of
    the 256 cap is 102 (benchmarks/results/h100-2026-12-07-verl-profile, metrics.jsonl), and a real model's responses
    run far below their cap."""
    series = trial_attrs.get("series") or {}
    changes = {}
    prompt = _finite_median(series.get(PROMPT_MEAN_KEY))
    if prompt is not None and prompt > 0:
        changes["prompt_fill"] = min(prompt / workload.max_prompt_length, 1.0)
    response = _finite_median(series.get(RESPONSE_MEAN_KEY))
    if response is not None and response > 0:
        changes["mean_response_length"] = min(response, float(workload.max_response_length))
    return replace(workload, **changes) if changes else workload


def lengths_line(study: optuna.Study) -> str | None:
    """One line for `show`: the prompt and response means verl measured over the study's probes (the median of its
    probes' medians) against the workload's assumed ones, which the time model priced the candidates at; None where
    no probe logged them (the sim, the torch backend, studies before 2026-12-08)."""
    identity = study.user_attrs.get("identity") or {}
    if "workload" not in identity:  # not an autotune study, or one from before its identity kept the workload
        return None
    workload = workload_of(identity)
    measured = [measured_workload(workload, t.user_attrs) for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("state") == "measured" and not t.user_attrs.get("simulated")]
    measured = [w for w in measured if w is not workload]
    if not measured:
        return None
    prompt = statistics.median(w.prompt_fill * w.max_prompt_length for w in measured)
    response = statistics.median(w.response_mean for w in measured)
    return (f"verl measured prompts of {prompt:.0f} and responses of {response:.0f} tokens on median; the time model "
            f"priced this study's candidates at {workload.prompt_fill * workload.max_prompt_length:.0f} and "
            f"{workload.response_mean:.0f} (tune.yaml's workload.prompt_fill and response_length.mean set them) and "
            f"the node profile takes the measured ones")


def _finite_median(values) -> float | None:
    finite = [float(v) for v in values or () if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(finite) if finite else None


def summary(study: optuna.Study, storage_url: str) -> dict:
    """The result.json document."""
    identity = identity_of(study)
    recs = records(study)
    best = best_records(study, k=1)
    base = baseline_record(study)
    doc = {
        "backend": identity["backend"],
        "model": identity["model"],
        "gpu": identity["gpu"],
        "gpus": identity["gpus_per_node"] * identity["nodes"],
        "gpus_per_node": identity["gpus_per_node"],
        "nodes": identity["nodes"],
        "study": study.study_name,
        "storage": redact(storage_url),
        "simulated": identity["backend"] == "sim",
        "trials_total": len(recs),
        "trials_complete": sum(r.feasible_measurement and r.optuna_state == "COMPLETE" for r in recs),
        "trials_failed_oom": sum(r.state == "oom" for r in recs),
        "trials_rejected_before_launch": sum(r.state == "rejected" for r in recs),
        "trials_inferred_oom": sum(r.state == "inferred_oom" for r in recs),
        "probes_launched": sum(bool(r.user_attrs.get("launched")) for r in recs),
        "prescreen_margin": study.user_attrs.get("prescreen_margin"),
        # the largest measured/predicted peak of a probe that fitted: the memory gate scales predictions by it
        "memory_under_prediction": measured_under_prediction(study),
        "stopped_by": study.user_attrs.get("stopped_by"),
        "objective": identity.get("objective", "throughput"),
        "trials_pruned": sum(r.optuna_state == "PRUNED" for r in recs),
        "trials_failed": sum(r.optuna_state == "FAIL" for r in recs),
        "workload": identity["workload"],
        "best": trial_doc(best[0]) if best else None,
        "baseline": trial_doc(base) if base and base.feasible_measurement else None,
        "baseline_is": baseline_label(study),  # "your job" (--from) or "verl default"
        "model_path": model_from_identity(identity).model_path,
    }
    if base is not None and not base.feasible_measurement:
        doc["baseline_outcome"] = {"trial": base.number, "state": base.state, "reason": base.reason}
    default = verl_default_record(study)
    if default is not None:
        doc["verl_default"] = (trial_doc(default) if default.feasible_measurement
                               else {"trial": default.number, "state": default.state, "reason": default.reason})
    if len(study.directions) == 2:
        doc["pareto_front"] = [trial_doc(r) for r in pareto_front(study)]
        doc["memory_margin_gib"] = study.user_attrs.get("memory_margin_gib", 0.0)
    if doc["best"] and doc["baseline"]:
        doc["speedup_vs_baseline"] = doc["best"]["tokens_per_s_per_gpu"] / doc["baseline"]["tokens_per_s_per_gpu"]
    if doc["best"] and default is not None and default.feasible_measurement:
        doc["speedup_vs_verl_default"] = doc["best"]["tokens_per_s_per_gpu"] / default.tokens_per_s_per_gpu
    # a score's noise on this node from the study's own repeats, and the interval it puts on the speedup (with the
    # noise assumed where nothing was repeated: storage/noise.score_noise); the sim has no measurement noise
    doc["noise"] = None if doc["simulated"] else measured_noise(recs)
    if doc.get("speedup_vs_baseline"):
        interval = None if doc["simulated"] else speedup_interval(best[0], base, doc["noise"])
        doc["speedup_vs_baseline_interval"] = [round(v, 4) for v in interval] if interval else None
        doc["noise_per_probe"] = None if doc["simulated"] else dict(zip(("sigma_rel", "dof"), score_noise(doc["noise"])))
    # the results the exported one is tied with (storage/records.py TIE_FRACTION): it is the one with the most headroom
    ranked = best_records(study, k=len(recs))
    doc["tied_with_best"] = ([r.number for r in tied_with_fastest(sorted(ranked, key=lambda r: -ranking_score(r)))
                              if r.number != ranked[0].number] if ranked else [])
    doc["tie_fraction"] = TIE_FRACTION
    # each knob the best changed against the baseline, and the phases it moved (storage/changes.py)
    doc["changes_vs_baseline"] = changes_doc(doc["baseline"], doc["best"])
    # what the tuning cost and when it pays back on the run it tunes (storage/tuning_cost.py)
    doc["tuning_cost"] = tuning_cost(recs, doc["gpus"], simulated=doc["simulated"])
    doc["payback"] = payback(doc["tuning_cost"], world_size=doc["gpus"], speedup=doc.get("speedup_vs_baseline"),
                             best_step_s=best[0].user_attrs.get("step_s") if best else None,
                             planned_steps=planned_steps(identity.get("passthrough") or {}))
    return doc


def trial_doc(rec: TrialRecord) -> dict:
    attrs = rec.user_attrs
    return {"trial": rec.number, "params": attrs.get("candidate", rec.params),
            "tokens_per_s_per_gpu": rec.tokens_per_s_per_gpu, "mfu": rec.mfu, "peak_mem_gib": rec.peak_mem_gib,
            "phase_s": rec.phase_s, "simulated": bool(attrs.get("simulated")),
            "workload_tuned": attrs.get("workload_tuned") or {},
            # where probes are noisy: the corrected model's throughput the export ranked by, and every probe of it
            "posterior_tokens_per_s_per_gpu": attrs.get(POSTERIOR_ATTR), "probes": attrs.get("repeats")}


def write_result_json(path: Path, doc: dict) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no empty result.json.tmp behind
        raise
    tmp.replace(path)
    return path


def best_overrides(study: optuna.Study) -> list[str]:
    """The best trial as `key=value` lines (Hydra override syntax) to paste into a launch script."""
    from autotune.verl.export import hydra_overrides

    best = best_records(study, k=1)
    if not best:
        raise ConfigError(f"study {study.study_name!r} has no finished feasible trial to export yet")
    identity = identity_of(study)
    attrs = best[0].user_attrs
    candidate = Candidate.from_params(attrs["candidate"])
    overrides = verl_overrides(model_from_identity(identity), workload_of(identity, attrs), candidate,
                               gpus_per_node=identity["gpus_per_node"], nodes=identity["nodes"],
                               passthrough=identity.get("passthrough") or {})
    return hydra_overrides(overrides, model_engine(candidate))


@dataclass(frozen=True)
class Exported:
    path: Path  # OUT/best.yaml
    written: bool  # False: a hand-edited best.yaml was kept as it is
    note: str | None = None  # one line on a hand-edited file: kept, or set aside


def export_best(study: optuna.Study, out_dir: Path, *, keep_edited: bool = False) -> Exported:
    """Write OUT/best.yaml from the best feasible measured trial of a stored study.

    A best.yaml autotune did not write (edited by hand: its signature line no longer matches) is never lost:
    `keep_edited` leaves it as it is (`report`); otherwise it is moved to best.edited.yaml first (`export`, `run`)."""
    best = best_records(study, k=1)
    if not best:
        raise ConfigError(f"study {study.study_name!r} has no finished feasible trial to export yet")
    identity = identity_of(study)
    rec = best[0]
    attrs = rec.user_attrs
    model = model_from_identity(identity)
    candidate = Candidate.from_params(attrs["candidate"])
    workload = workload_of(identity, attrs)
    gpn, nodes = identity["gpus_per_node"], identity["nodes"]
    overrides = verl_overrides(model, workload, candidate, gpus_per_node=gpn, nodes=nodes,
                               passthrough=identity.get("passthrough") or {})
    base = baseline_record(study)
    header = export_header(model=model, gpu_name=get_gpu(identity["gpu"]).name, gpus_per_node=gpn, nodes=nodes,
                           backend=identity["backend"], simulated=bool(attrs.get("simulated")),
                           study=study.study_name, trial=rec.number, tokens_per_s_per_gpu=rec.tokens_per_s_per_gpu,
                           mfu=rec.mfu, peak_mem_gib=rec.peak_mem_gib or 0.0,
                           baseline_tokens_per_s_per_gpu=base.tokens_per_s_per_gpu if base and base.feasible_measurement else None,
                           tuned_workload_knobs=tuple(sorted(attrs.get("workload_tuned") or {})), config_dir=out_dir,
                           baseline_label=baseline_label(study), baseline_trial=base.number if base else None,
                           verl_default_tokens_per_s_per_gpu=_default_tps(study),
                           exported_model_path=overrides.get("actor_rollout_ref.model.path"),
                           # any candidate of the study agrees with the user's job on every held knob
                           holds=holds(identity.get("passthrough") or {}, candidate.actor_engine, workload.lora_rank,
                                       candidate.rollout_tp),
                           env=identity.get("env") or {}, candidate=candidate)
    path = Path(out_dir) / "best.yaml"
    if edited_by_hand(path):
        if keep_edited:
            return Exported(path, False, f"kept {path} as it is: it was edited after autotune wrote it (`autotune "
                                         "export` writes autotune's and keeps yours as best.edited.yaml)")
        kept = set_aside(path)
        note = f"{path} was edited after autotune wrote it: kept as {kept}"
        return Exported(write_best_yaml(path, overrides, model_engine(candidate), header), True, note)
    return Exported(write_best_yaml(path, overrides, model_engine(candidate), header), True)


def _default_tps(study: optuna.Study) -> float | None:
    rec = verl_default_record(study)
    return rec.tokens_per_s_per_gpu if rec is not None and rec.feasible_measurement else None
