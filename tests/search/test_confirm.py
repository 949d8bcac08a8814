"""Confirm before export (autotune/search/confirm.py): the leaders within noise are probed again, the export is the
configuration with the best mean over its probes, and nothing is confirmed where a probe is deterministic."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from autotune.backends.sim import SimRunner
from autotune.config import Budget, SearchOptions
from autotune.search import confirm
from autotune.search.budget import confirm_held
from autotune.search.driver import run_study
from autotune.storage.records import best_records, records
from sim_study import sim_cfg as _cfg


class _NoisyMachine(SimRunner):
    """TEST DOUBLE: the sim's score times one log-normal factor per probe (sigma 0.1), as a real node's probes move."""

    simulated = False

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def probe(self, request, report):
        result = super().probe(request, report)
        factor = math.exp(self._rng.gauss(0.0, 0.1))
        series = {"perf/throughput": [v * factor for v in result.series["perf/throughput"]]}
        return replace(result, tokens_per_s_per_gpu=result.tokens_per_s_per_gpu * factor, simulated=False,
                       series=series)




def test_the_leaders_are_probed_again_and_the_export_is_the_best_mean(tmp_path):
    study = run_study(_cfg(tmp_path, trials=14), _NoisyMachine(seed=1))
    confirmed = study.user_attrs[confirm.CONFIRM_ATTR]
    assert 1 <= len(confirmed) <= 2
    again = [t for t in study.trials if "confirms" in t.user_attrs]
    assert sorted(t.user_attrs["confirms"] for t in again) == sorted(confirmed)
    assert all(t.user_attrs.get("launched") and "duplicate_of" not in t.user_attrs for t in again)
    assert len(study.trials) == 14, "the confirmations come out of --trials, not on top of it"
    best = best_records(study, k=1)[0]
    assert best.number in confirmed
    probes = {p["trial"]: p["tokens_per_s_per_gpu"] for p in best.user_attrs["repeats"]}
    assert len(probes) == 2
    assert best.tokens_per_s_per_gpu == pytest.approx(math.sqrt(math.prod(probes.values())), rel=1e-9)


def test_a_deterministic_probe_and_a_small_study_confirm_nothing(tmp_path):
    assert confirm_held(_cfg(tmp_path, trials=30), SimRunner()) == 0
    assert confirm_held(_cfg(tmp_path, trials=30), _NoisyMachine()) == 2
    assert confirm_held(_cfg(tmp_path, trials=9), _NoisyMachine()) == 0
    assert confirm_held(_cfg(tmp_path, trials=30, budget=Budget(probes=8)), _NoisyMachine()) == 0
    assert confirm_held(_cfg(tmp_path, trials=30, search=SearchOptions(confirm=0)), _NoisyMachine()) == 0
    study = run_study(_cfg(tmp_path, trials=14), SimRunner())
    assert confirm.CONFIRM_ATTR not in study.user_attrs
    assert not any("confirms" in t.user_attrs for t in study.trials)


def test_a_probe_budget_keeps_the_confirmations_probes(tmp_path):
    study = run_study(_cfg(tmp_path, trials=100, budget=Budget(probes=10)), _NoisyMachine(seed=2))
    launched = [t for t in study.trials if t.user_attrs.get("launched")]
    assert len(launched) == 10
    assert [t for t in launched if "confirms" in t.user_attrs], "the last probes confirm the leaders"
    assert study.user_attrs.get("stopped_by", "").startswith("probe budget reached")


def test_a_resumed_study_does_not_confirm_twice(tmp_path):
    run_study(_cfg(tmp_path, trials=12), _NoisyMachine(seed=3))
    study = run_study(_cfg(tmp_path, trials=16), _NoisyMachine(seed=4))
    assert sum("confirms" in t.user_attrs for t in study.trials) <= 2
    assert len(study.trials) == 16
    assert all(r.state != "running" for r in records(study))
