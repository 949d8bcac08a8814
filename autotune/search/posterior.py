"""The export by posterior, not by the luckiest probe (issue 34): where probes are noisy, each measured
configuration's throughput under the corrected model (search/learned.py: the cost model times each phase's learned
residual, every probe an observation with the study's measured noise) is stored on the study, and the export ranks
by it (storage/records.best_records).

A measured score is one draw; the corrected model's value at that configuration weighs the draw against every other
probe that shares its layout, rollout setting or micro-batching, so a configuration that measured high by luck is
pulled back toward what its neighbours say. With confirmation and the measured noise term, on 20 fresh 7B machines
of the search benchmark with a per-probe noise of sigma 0.1 (benchmarks/export_regret.py, results/export_regret.txt),
the export's true regret after 40 probes went from 7.2% to 2.9%, and the exported score's overstatement from x1.204
to x1.063.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from autotune.config import TuneConfig
from autotune.search.equivalence import canonical_params
from autotune.search.learned import NOISY_ATTR, CorrectedModel, base_prediction, trial_workload
from autotune.spaces.candidate import Candidate
from autotune.storage.records import POSTERIOR_ATTR, TrialRecord, is_result, pooled
from autotune.verl.roles import separate_reference


def scores(trials: list[FrozenTrial], cfg: TuneConfig, model: CorrectedModel) -> dict[str, float]:
    """{trial number (str): tokens/s/GPU at its posterior median} for each measured configuration's first trial."""
    out = {}
    for rec in pooled([TrialRecord.of(t) for t in trials if is_result(t)]):
        cand = Candidate.from_params(rec.user_attrs["candidate"])
        base = base_prediction(cfg, cand, trial_workload(cfg, rec.user_attrs))
        if not base.feasible or not base.phase_s:
            continue
        step_s = model.step_s(canonical_params(cand.as_params(), separate_reference(cfg.workload)), base)
        out[str(rec.number)] = base.tokens_per_step / base.world / step_s
    return out


def store(study: optuna.Study, cfg: TuneConfig) -> None:
    """Store every measured configuration's posterior throughput on the study, where its probes are noisy."""
    if not study.user_attrs.get(NOISY_ATTR) or not cfg.search.learn:
        return
    trials = study.get_trials(deepcopy=False)
    study.set_user_attr(POSTERIOR_ATTR, scores(trials, cfg, CorrectedModel.from_trials(trials, cfg, study)))
