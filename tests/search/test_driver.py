from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.config import Budget, SearchOptions, TuneConfig
from autotune.errors import ConfigError
from autotune.hardware import get_gpu
from autotune.backends.base import get_runner
from autotune.backends.sim import SimRunner
from autotune.search.driver import fail_dead_local_trials, open_study, run_study
from autotune.storage.records import best_records, records
from sim_study import sim_cfg as _cfg




def test_study_starts_from_verls_default_and_records_every_outcome(tmp_path):
    study = run_study(_cfg(tmp_path, trials=25), get_runner("sim"))
    recs = records(study)
    assert len(recs) == 25
    assert recs[0].baseline and recs[0].state == "simulated"
    assert recs[0].params["ppo_micro_batch_size_per_gpu"] == 4 and recs[0].params["rollout_tp"] == 2
    assert all(r.state in {"simulated", "rejected", "oom", "inferred_oom", "pruned"} and r.reason for r in recs)
    assert any(t.user_attrs.get("warm_start") == 0 for t in study.trials[1:4]), "model's best right after baseline"
    for t in study.trials:
        assert set(t.constraints) == {"rules", "memory"}, "same constraint vector on every trial"
        if t.user_attrs["state"] == "rejected" and "violations" in t.user_attrs:
            assert t.constraints["rules"] > 0 and t.value == 0.0
        elif t.user_attrs["state"] == "rejected":
            assert t.constraints["memory"] > 0 and "predicted OOM before launch" in t.user_attrs["reason"]
            assert not t.user_attrs.get("launched")
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


def test_a_study_stored_before_a_workload_field_existed_resumes_while_the_field_holds_its_default(tmp_path):
    # the 2026-12-05 H200 study was stored before Workload had megatron_optimizer_offload_fraction; the next
    # autotune refused to resume it ("differs in: workload")
    cfg = _cfg(tmp_path, trials=2)
    study = run_study(cfg, get_runner("sim"))
    identity = dict(study.user_attrs["identity"])
    identity["workload"] = {k: v for k, v in identity["workload"].items()
                            if not k.startswith("megatron_optimizer")}
    study.set_user_attr("identity", identity)
    resumed = run_study(_cfg(tmp_path, trials=3), get_runner("sim"))
    assert sum(t.state.is_finished() for t in resumed.trials) == 3
    offloading = replace(cfg, workload=replace(cfg.workload, megatron_optimizer_offload_fraction=0.5))
    with pytest.raises(ConfigError, match="differs in: workload"):
        open_study(offloading)


def test_pinned_knobs_hold_and_workload_never_changes(tmp_path):
    cfg = _cfg(tmp_path, trials=10, fixed={"actor_engine": "megatron", "actor_tp": 2, "cuda_device_max_connections": 1})
    study = run_study(cfg, get_runner("sim"))
    for t in study.trials:
        assert t.user_attrs["candidate"]["actor_engine"] == "megatron" and t.user_attrs["candidate"]["actor_tp"] == 2
        assert "actor_engine" not in t.params and "workload_tuned" not in t.user_attrs


def _sim_without_liger():
    """The sim standing in for a real backend on a machine without liger-kernel (a test double)."""
    from autotune.backends.sim import SimRunner

    class NoLigerHere(SimRunner):
        def held_off(self):
            return {"use_liger": False}

    return NoLigerHere()


def test_knobs_the_backend_holds_off_are_never_proposed_unless_the_user_pins_them(tmp_path):
    study = run_study(_cfg(tmp_path, trials=12, fixed={"actor_engine": "fsdp"}), _sim_without_liger())
    assert all(t.user_attrs["candidate"]["use_liger"] is False and "use_liger" not in t.params for t in study.trials)
    pinned = run_study(_cfg(tmp_path / "p", trials=4, fixed={"actor_engine": "fsdp", "use_liger": True},
                            storage_url=f"sqlite:///{tmp_path / 'p.db'}"), _sim_without_liger())
    assert all(t.user_attrs["candidate"]["use_liger"] is True for t in pinned.trials if not t.user_attrs.get("baseline"))


def _sim_measuring_fsdp_only():
    """The sim standing in for the torch backend, which measures FSDP layouts only (a test double)."""
    from autotune.backends.sim import SimRunner
    from autotune.backends.select import knobs_held_off
    from autotune.backends.torch.runner import MEASURABLE_CHOICES, unsupported_reason

    class FsdpOnly(SimRunner):
        def measurable_choices(self):
            return MEASURABLE_CHOICES

        def held_off(self):  # as TorchRunner: liger-kernel may be missing here
            return knobs_held_off()

        def unsupported(self, candidate, workload):
            return unsupported_reason(candidate, workload)

    return FsdpOnly()


def test_no_trial_is_spent_on_what_the_backend_cannot_measure(tmp_path):
    # the 7B study on one H200 spent 30 of 40 trials on Megatron candidates the torch backend then rejected
    study = run_study(_cfg(tmp_path, trials=20, gpus_per_node=1), _sim_measuring_fsdp_only())
    engines = {t.user_attrs["candidate"]["actor_engine"] for t in study.trials}
    assert engines <= {"fsdp", "fsdp2"} and len(study.trials) >= 20
    assert not any("not measurable" in t.user_attrs.get("reason", "") for t in study.trials)


def test_a_users_engine_choice_meets_what_the_backend_measures(tmp_path):
    from autotune.search.driver import fit_to_runner

    runner = _sim_measuring_fsdp_only()
    cfg = fit_to_runner(_cfg(tmp_path, ranges={"actor_engine": ["megatron", "fsdp2"]}), runner)
    assert cfg.ranges["actor_engine"] == ["fsdp2"] and cfg.ranges["ulysses_sp"] == [1]
    with pytest.raises(ConfigError, match="cannot measure actor_engine='megatron'"):
        fit_to_runner(_cfg(tmp_path, fixed={"actor_engine": "megatron"}), runner)
    with pytest.raises(ConfigError, match="measures none of"):
        fit_to_runner(_cfg(tmp_path, ranges={"actor_engine": ["megatron"]}), runner)
    assert fit_to_runner(_cfg(tmp_path), get_runner("sim")).ranges == {}


def test_resuming_a_study_with_other_engine_choices_is_a_clear_error_and_keeps_its_trials(tmp_path):
    run_study(_cfg(tmp_path, trials=6, gpus_per_node=1), get_runner("sim"))  # offers megatron too
    with pytest.raises(ConfigError, match="started with other choices"):
        run_study(_cfg(tmp_path, trials=12, gpus_per_node=1), _sim_measuring_fsdp_only())
    study = open_study(_cfg(tmp_path, gpus_per_node=1))
    assert len([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]) >= 6
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


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


def _underestimating_sim():
    """TEST DOUBLE machine: activations 3x what the model believes, so the gate lets OOMs through."""
    from dataclasses import replace as dc_replace

    from autotune.model.calibration import ACTIVATIONS, DEFAULT_CONSTANTS
    from autotune.backends.sim import SimRunner

    heavy = dc_replace(ACTIVATIONS, per_h=ACTIVATIONS.per_h * 3, per_i=ACTIVATIONS.per_i * 3,
                       logits_transient_bytes=ACTIVATIONS.logits_transient_bytes * 3)
    return SimRunner(constants=dc_replace(DEFAULT_CONSTANTS, activations=heavy))


ONE_KNOB = {"actor_engine": "fsdp", "use_dynamic_bsz": False, "ulysses_sp": 1, "rollout_tp": 2,
            "gpu_memory_utilization": 0.5, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
            "enable_chunked_prefill": True, "log_prob_micro_batch_size_per_gpu": 8,
            "ref_log_prob_micro_batch_size_per_gpu": 8, "gradient_checkpointing": False, "activation_offload": False,
            "param_offload": False, "optimizer_offload": False, "ref_param_offload": False, "use_remove_padding": True,
            "use_torch_compile": True}


def test_measured_oom_tightens_the_gate_and_bigger_points_are_inferred_not_launched(tmp_path):
    # no memory pre-screen: only measured OOMs and the boundary inference keep big micro-batches out
    cfg = _cfg(tmp_path, trials=8, fixed=ONE_KNOB, search=SearchOptions(warm_start=0, prescreen=False))
    for micro in (8, 16, 32):  # the order a hand bisection would take: the first OOM decides the rest
        open_study(cfg).enqueue_trial({"ppo_micro_batch_size_per_gpu": micro})
    study = run_study(cfg, _underestimating_sim())
    ooms = [t for t in study.trials if t.user_attrs["state"] == "oom" and "duplicate_of" not in t.user_attrs]
    assert ooms and all(t.user_attrs["launched"] for t in ooms)
    assert study.user_attrs["prescreen_margin"] < -0.04
    inferred = [t for t in study.trials if t.user_attrs["state"] == "inferred_oom"]
    for t in inferred:
        src = study.trials[t.user_attrs["inferred_from"]]
        assert not t.user_attrs.get("launched") and "inferred, not measured" in t.user_attrs["reason"]
        assert t.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"] >= src.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"]
        assert t.constraints["memory"] > 0
    assert [t.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"] for t in inferred][:2] == [16, 32]
    launched_micro = [t.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"] for t in study.trials
                      if t.user_attrs.get("launched") and t.user_attrs["state"] != "oom"]
    assert all(m < min(o.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"] for o in ooms) for m in launched_micro)


def test_probe_budget_stops_the_search(tmp_path):
    cfg = _cfg(tmp_path, trials=40, budget=Budget(probes=5))
    study = run_study(cfg, get_runner("sim"))
    assert sum(bool(t.user_attrs.get("launched")) for t in study.trials) == 5
    assert study.user_attrs["stopped_by"] == "probe budget reached (5 probes)"


def test_gpu_hour_budget_counts_probe_time_times_gpus(tmp_path):
    cfg = _cfg(tmp_path, trials=40, budget=Budget(gpu_hours=2.0))
    study = run_study(cfg, get_runner("sim"))
    launched = [t for t in study.trials if t.user_attrs.get("launched")]
    used = sum(t.user_attrs["probe_wall_s"] for t in launched) * 8 / 3600
    assert used >= 2.0 and used - launched[-1].user_attrs["probe_wall_s"] * 8 / 3600 < 2.0


def test_multi_objective_picks_the_fastest_with_enough_headroom(tmp_path):
    from autotune.storage.records import TIE_FRACTION, best_records, feasible_measured, pareto_front

    cfg = _cfg(tmp_path, trials=14, search=SearchOptions(objective="throughput_and_memory", memory_margin_gib=40))
    study = run_study(cfg, get_runner("sim"))
    assert len(study.directions) == 2
    front = pareto_front(study)
    assert front and all(r.feasible_measurement for r in front)
    # Optuna's front (study.best_trials) is exactly the results no other result dominates
    results = feasible_measured(study)

    def dominated(r) -> bool:
        return any(o.tokens_per_s_per_gpu >= r.tokens_per_s_per_gpu and o.peak_mem_gib <= r.peak_mem_gib
                   and (o.tokens_per_s_per_gpu, o.peak_mem_gib) != (r.tokens_per_s_per_gpu, r.peak_mem_gib)
                   for o in results)

    assert {r.number for r in front} == {r.number for r in results if not dominated(r)}
    best = best_records(study, k=1)[0]
    assert best.peak_mem_gib <= get_gpu("H200").mem_gib - 40
    # the fastest with the headroom, or one tied with it within 1% and lighter (records.tie_break)
    assert all(r.tokens_per_s_per_gpu * (1 - TIE_FRACTION) <= best.tokens_per_s_per_gpu for r in front
               if r.peak_mem_gib <= get_gpu("H200").mem_gib - 40)


def test_a_candidate_whose_offload_overflows_the_hosts_ram_is_never_launched(tmp_path):
    """--host-mem-gib (or this machine's RAM for local probes): offloaded states must fit in it."""
    study = run_study(_cfg(tmp_path, trials=6, host_mem_gib=40.0, search=SearchOptions(warm_start=0)),
                      get_runner("sim"))
    host_rejected = [t for t in study.trials if "predicted host OOM" in t.user_attrs.get("reason", "")]
    assert host_rejected, [t.user_attrs.get("reason") for t in study.trials]
    for t in host_rejected:
        assert t.user_attrs["state"] == "rejected" and not t.user_attrs.get("launched")
        assert t.constraints["memory"] > 0 and t.user_attrs["predicted_host_gib"] > 0.9 * 40.0
    roomy = run_study(_cfg(tmp_path / "b", trials=6, host_mem_gib=4096.0, storage_url=f"sqlite:///{tmp_path / 'b.db'}",
                           search=SearchOptions(warm_start=0)), get_runner("sim"))
    assert not any("host OOM" in t.user_attrs.get("reason", "") for t in roomy.trials)


LORA_72B = Path(__file__).parents[1] / "data" / "verl_examples" / "qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh"


def _users_72b_job(tmp_path: Path, trials: int = 3) -> TuneConfig:
    """verl's own 72B LoRA example on H100s, a job verl's docs list as running, which the memory model calls OOM."""
    from autotune.cli import load_user_job

    job = load_user_job(LORA_72B, ["trainer.project_name=p", "trainer.experiment_name=e"], None)
    return _cfg(tmp_path, trials=trials, model=job.model, gpu=get_gpu("H100"), workload=job.workload,
                baseline=job.baseline, passthrough=job.passthrough, source=str(LORA_72B),
                search=SearchOptions(warm_start=1))


def test_the_users_job_stays_the_baseline_on_sim_when_the_model_predicts_it_ooms(tmp_path):
    from autotune.storage.results import summary

    study = run_study(_users_72b_job(tmp_path), get_runner("sim"))
    job = study.trials[0]
    assert job.user_attrs["baseline"] and job.user_attrs["state"] == "simulated", job.user_attrs.get("reason")
    assert "predicts OOM" in job.user_attrs["predicted_oom"] and job.user_attrs["peak_mem_gib"] > 79.6
    # the simulator is the model itself: a job it ran past its own prediction teaches the gate nothing
    assert study.user_attrs.get("prescreen_margin", -0.04) == -0.04 and "gate_learned" not in job.user_attrs
    doc = summary(study, "sqlite://")
    assert doc["baseline"]["trial"] == 0 and doc["speedup_vs_baseline"] is not None


class _RoomierMachine(SimRunner):
    """TEST DOUBLE machine: 141 GiB where the model plans for the H100's 80, so the user's job runs where the gate
    predicts an OOM; it plays a measuring backend (plain results, never the sim's own prediction)."""

    def probe(self, request, report):
        gpu = replace(request.gpu, mem_gib=get_gpu("H200").mem_gib)
        return super().probe(replace(request, gpu=gpu, users_job=False), report)


def test_the_users_job_is_launched_when_the_model_predicts_it_ooms_and_corrects_the_gate(tmp_path):
    study = run_study(_users_72b_job(tmp_path, trials=2), _RoomierMachine())
    job = study.trials[0]
    assert job.user_attrs["launched"] and job.user_attrs["state"] == "simulated", job.user_attrs.get("reason")
    assert "predicted OOM before launch" in job.user_attrs["predicted_oom"]
    ratio = job.user_attrs["predicted_memory_ratio"]
    assert ratio > 0.96 and study.user_attrs["prescreen_margin"] > ratio - 1.0  # the gate now admits this job
    assert "gate now admits" in job.user_attrs["gate_learned"]
    # verl's default of the same study is no evidence: it is still gated (no room for its KV cache)
    default = next(t for t in study.trials if t.user_attrs.get("verl_default"))
    assert default.user_attrs["state"] == "rejected" and "predicted OOM" in default.user_attrs["reason"]


class _HungrierMachine(SimRunner):
    """TEST DOUBLE machine whose every probe peaks 1.12x the model's prediction (real verl on an H100 peaked 1.11x
    it) and runs out of memory where that passes the card; it plays a measuring backend."""

    def probe(self, request, report):
        from autotune.errors import ProbeOOM

        result = super().probe(request, report)
        peak_gib = result.peak_mem_gib * 1.12
        if peak_gib > request.gpu.mem_gib:
            raise ProbeOOM(f"CUDA out of memory: {peak_gib:.1f} GiB", phase="update_actor",
                           over_gib=peak_gib - request.gpu.mem_gib, peak_mem_gib=peak_gib)
        return replace(result, peak_mem_gib=peak_gib)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_fit_that_peaked_above_the_model_keeps_the_next_near_capacity_candidates_from_an_oom(tmp_path, seed):
    """Before the gate learned from fits that peaked above their prediction, these studies launched 2-3 OOMs each
    (the margin moved only after one): each a launch's start-up spent on nothing."""
    from autotune.search.prescreen import measured_under_prediction

    study = run_study(_cfg(tmp_path, trials=30, seed=seed, search=SearchOptions(confirm=0)), _HungrierMachine())
    assert measured_under_prediction(study) == pytest.approx(1.12)
    assert not [t.number for t in study.trials if t.user_attrs.get("state") == "oom"]
    gated = [t for t in study.trials if "under-prediction" in (t.user_attrs.get("reason") or "")]
    assert gated, "candidates the model alone would have launched are kept back, and their reason says why"
