"""What the best changed against the baseline (autotune/storage/changes.py, issue 32 item 4), on the real H200
study and on a run as a user types it."""

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path


from autotune.spaces.candidate import Candidate
from autotune.storage.changes import changes_doc, describe_changes, knob_changes, phase_changes
from autotune.ui import candidate_summary

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def _doc(trial, simulated=False, phase_s=None, **changes):
    return {"trial": trial, "params": asdict(Candidate(**changes)), "phase_s": phase_s, "simulated": simulated}


def test_two_configurations_that_differ_in_compile_and_the_reference_micro_batch_no_longer_print_alike():
    """The quick start's trials 1 and 9 printed the same configuration string (5257 and 5291 tokens/s/GPU)."""
    one = asdict(Candidate(ref_log_prob_micro_batch_size_per_gpu=8, use_torch_compile=True))
    nine = asdict(Candidate(ref_log_prob_micro_batch_size_per_gpu=16, use_torch_compile=False))
    assert candidate_summary(one) != candidate_summary(nine)
    assert "/8 |" in candidate_summary(one) and "no-compile" in candidate_summary(nine)
    assert [c["knob"] for c in knob_changes(one, nine)] == ["ref_log_prob_micro_batch_size_per_gpu",
                                                            "use_torch_compile"]


def test_a_knob_the_batching_mode_leaves_unread_is_no_change():
    dyn = dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=24576)
    assert knob_changes(asdict(Candidate(**dyn, ppo_micro_batch_size_per_gpu=2)),
                        asdict(Candidate(**dyn, ppo_micro_batch_size_per_gpu=8))) == []
    assert knob_changes(asdict(Candidate(ppo_max_token_len_per_gpu=8192)),
                        asdict(Candidate(ppo_max_token_len_per_gpu=16384))) == []
    # switching the mode itself shows both sides: the mode and what it now reads
    moved = knob_changes(asdict(Candidate()), asdict(Candidate(**dyn)))
    assert {c["knob"] for c in moved} >= {"use_dynamic_bsz", "ppo_max_token_len_per_gpu"}


def test_phases_largest_move_first_and_the_step_total_is_no_phase():
    rows = phase_changes({"gen": 12.1, "update_actor": 21.4, "step": 47.0}, {"gen": 10.1, "update_actor": 13.9,
                                                                                "step": 36.0})
    assert [r["phase"] for r in rows] == ["update_actor", "gen"]


def test_the_line_names_old_and_new_values_and_labels_simulated_phases():
    doc = changes_doc(_doc(0, True, {"gen": 3.0}), _doc(5, True, {"gen": 2.0}, use_torch_compile=False))
    line = describe_changes(doc, "your job")
    assert line == ("trial 5 against your job (trial 0): changed use_torch_compile on -> off; "
                    "simulated phase s gen 3.0 -> 2.0")
    assert changes_doc(_doc(0), _doc(0)) is None and describe_changes(None, "your job") is None


def test_a_run_says_what_its_best_changed(tmp_path):
    out = tmp_path / "out"
    proc = _run("run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--out", str(out), "--trials", "8", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "result.json").read_text())
    changes = doc["changes_vs_baseline"]
    assert changes["best_trial"] == doc["best"]["trial"] and changes["simulated"] is True and changes["knobs"]
    for c in changes["knobs"]:
        assert doc["baseline"]["params"][c["knob"]] == c["from"] and doc["best"]["params"][c["knob"]] == c["to"]
    assert describe_changes(changes, doc["baseline_is"]) in proc.stdout
    show = _run("show", "--out", str(out))
    assert describe_changes(changes, doc["baseline_is"]) in show.stdout.replace("\n", "")


def test_the_h200_studys_best_changed_only_micro_batches(best=4):
    """The real verl study of 2026-12-05: the best (trial 4) changed the three micro-batches and moved update_actor
    most (21.4 -> 13.9 s); its rollout moved too (12.1 -> 10.1 s), which no micro-batch touches: one step's noise."""
    import optuna

    from autotune.storage.records import TrialRecord
    from autotune.storage.results import trial_doc

    storage = optuna.storages.RDBStorage(f"sqlite:///{RESULTS / 'h200-2026-12-05-verl-shared' / 'autotune.db'}")
    (summary,) = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()
    doc = changes_doc(trial_doc(TrialRecord.of(trials[0])), trial_doc(TrialRecord.of(trials[best])))
    assert [c["knob"] for c in doc["knobs"]] == ["ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu",
                                                 "ref_log_prob_micro_batch_size_per_gpu"]
    assert doc["phase_s"][0]["phase"] == "update_actor" and doc["simulated"] is False
