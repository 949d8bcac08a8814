from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.config import ProbeBudget, TuneConfig
from autotune.errors import ConfigError
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.objectives.base import get_runner
from autotune.search.driver import fail_dead_local_trials, open_study, run_study
from autotune.storage.records import best_records, records
from autotune.workload import Workload


def _cfg(tmp_path: Path, trials=12, **kw) -> TuneConfig:
    base = dict(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                trials=trials, storage_url=f"sqlite:///{tmp_path / 'a.db'}", study_name="s", out_dir=tmp_path,
                seed=3, workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget())
    base.update(kw)
    return TuneConfig(**base)


def test_study_starts_from_verls_default_and_records_every_outcome(tmp_path):
    study = run_study(_cfg(tmp_path, trials=25), get_runner("sim"))
    recs = records(study)
    assert len(recs) == 25
    assert recs[0].baseline and recs[0].state == "simulated"
    assert recs[0].params["ppo_micro_batch_size_per_gpu"] == 4 and recs[0].params["rollout_tp"] == 2
    assert all(r.state in {"simulated", "rejected", "oom", "pruned"} and r.reason for r in recs)
    for t in study.trials:
        assert set(t.constraints) == {"rules", "memory"}, "same constraint vector on every trial"
        if t.user_attrs["state"] == "rejected":
            assert t.constraints["rules"] > 0 and t.value == 0.0 and t.user_attrs["violations"]
        if t.user_attrs["state"] == "oom":
            assert t.constraints["memory"] > 0
    best = best_records(study, k=1)[0]
    assert best.tokens_per_s_per_gpu >= recs[0].tokens_per_s_per_gpu > 0


def test_second_run_resumes_instead_of_starting_over(tmp_path):
    run_study(_cfg(tmp_path, trials=6), get_runner("sim"))
    study = run_study(_cfg(tmp_path, trials=10), get_runner("sim"))
    assert len(study.trials) == 10
    assert sum(t.user_attrs.get("baseline", False) for t in study.trials) == 1


def test_resuming_with_a_different_job_is_refused(tmp_path):
    run_study(_cfg(tmp_path, trials=2), get_runner("sim"))
    with pytest.raises(ConfigError, match="differs in: gpus_per_node"):
        open_study(_cfg(tmp_path, gpus_per_node=4))


def test_pinned_knobs_hold_and_workload_never_changes(tmp_path):
    cfg = _cfg(tmp_path, trials=10, fixed={"actor_engine": "megatron", "actor_tp": 2, "cuda_device_max_connections": 1})
    study = run_study(cfg, get_runner("sim"))
    for t in study.trials:
        assert t.user_attrs["candidate"]["actor_engine"] == "megatron" and t.user_attrs["candidate"]["actor_tp"] == 2
        assert "actor_engine" not in t.params and "workload_tuned" not in t.user_attrs


def test_opted_in_workload_knob_is_recorded(tmp_path):
    cfg = _cfg(tmp_path, trials=8, tune_workload=("ppo_mini_batch_size",))
    study = run_study(cfg, get_runner("sim"))
    assert any("workload.ppo_mini_batch_size" in t.params for t in study.trials)
    for t in study.trials:
        assert t.user_attrs["workload_tuned"] == {"ppo_mini_batch_size": t.params["workload.ppo_mini_batch_size"]}


def test_trial_of_a_dead_tuner_process_is_failed_with_a_reason(tmp_path):
    cfg = _cfg(tmp_path, trials=1)
    study = open_study(cfg)
    trial = study.ask()
    import socket
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", 2**22 + 12345)  # no such process
    assert fail_dead_local_trials(study) == 1
    t = study.trials[0]
    assert t.state == optuna.trial.TrialState.FAIL and "interrupted" in t.user_attrs["reason"]


def test_duplicate_proposals_reuse_the_finished_result(tmp_path):
    cfg = _cfg(tmp_path, trials=6, ranges={k: [v] for k, v in {
        "rollout_tp": 2, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "actor_engine": "fsdp"}.items()},
        fixed={"use_dynamic_bsz": False, "ppo_micro_batch_size_per_gpu": 4, "log_prob_micro_batch_size_per_gpu": 8,
               "ref_log_prob_micro_batch_size_per_gpu": 8, "gradient_checkpointing": True,
               "activation_offload": False, "param_offload": False, "optimizer_offload": False,
               "ref_param_offload": False, "use_remove_padding": True, "use_torch_compile": True,
               "enable_chunked_prefill": True, "ulysses_sp": 1, "gpu_memory_utilization": 0.5})
    study = run_study(cfg, get_runner("sim"))
    dups = [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert dups and all(t.value == study.trials[t.user_attrs["duplicate_of"]].value for t in dups)
