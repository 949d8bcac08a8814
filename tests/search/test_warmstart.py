from pathlib import Path

from autotune.config import ProbeBudget, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.search.equivalence import layout_key, rollout_key
from autotune.search.prescreen import MemoryGate
from autotune.search.warmstart import Ranked, _spread, predicted, rank_space
from autotune.spaces.candidate import Candidate
from autotune.spaces.space import SearchSpace
from autotune.workload import Workload


def _cfg() -> TuneConfig:
    return TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                      trials=10, storage_url="sqlite:///:memory:", study_name="s", out_dir=Path("/nonexistent"), seed=3,
                      workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget())


def test_the_warm_start_is_the_best_prediction_then_new_layouts_and_rollout_settings():
    cfg = _cfg()
    space = SearchSpace.build(cfg.model, cfg.workload, gpus_per_node=8, nodes=1)
    gate = MemoryGate()
    ranked = rank_space(cfg, space, gate, samples=600, keep=3, seed=1)
    assert len(ranked) == 3
    for r in ranked:  # each passes verl's rules and the gate, and its score is the model's
        assert predicted(cfg, r.candidate, r.workload, gate) == r.predicted_tokens_per_s_per_gpu
    assert ranked[0].predicted_tokens_per_s_per_gpu == max(r.predicted_tokens_per_s_per_gpu for r in ranked)
    params = [r.candidate.as_params() for r in ranked]
    assert len({layout_key(p) for p in params}) + len({rollout_key(p) for p in params}) >= 5


def test_spread_prefers_new_parts_then_falls_back_to_distinct_points():
    a = Candidate(actor_engine="fsdp", rollout_tp=1, max_num_seqs=1024)
    twin = a.with_(ppo_micro_batch_size_per_gpu=8)  # same layout, same rollout setting
    new_layout = a.with_(actor_engine="fsdp2")
    both_new = a.with_(actor_engine="megatron", actor_tp=2, rollout_tp=2)
    w = Workload()
    ranked = [Ranked(100, a, w), Ranked(99, twin, w), Ranked(98, new_layout, w), Ranked(90, both_new, w)]
    assert [r.candidate for r in _spread(ranked, 2)] == [a, both_new]
    assert [r.candidate for r in _spread(ranked, 3)] == [a, both_new, new_layout]
    assert [r.candidate for r in _spread(ranked, 4)] == [a, both_new, new_layout, twin]


# ---- issue 32 item 6: an MoE study tries experts spread wide, as verl's MoE recipes do -----------------------

def _moe_cfg(name: str = "qwen3-30b-a3b", **kw) -> TuneConfig:
    from dataclasses import replace
    return replace(_cfg(), model=get_model(name), **kw)


def test_an_moe_study_is_seeded_with_the_widest_expert_parallel_layout_verl_accepts():
    from autotune.search.warmstart import expert_parallel_start
    from autotune.verl.judge import judge_candidates

    cfg = _moe_cfg()
    space = SearchSpace.build(cfg.model, cfg.workload, gpus_per_node=8, nodes=1)
    start = expert_parallel_start(cfg, space, MemoryGate(), samples=300, seed=1)
    assert start.candidate.actor_engine == "megatron" and start.candidate.actor_ep == 8  # verl's 30B-A3B recipe: EP8
    assert predicted(cfg, start.candidate, start.workload, MemoryGate()) == start.predicted_tokens_per_s_per_gpu
    [row] = judge_candidates("ep8", cfg.model, cfg.workload, 8, 1, [start.candidate])
    assert row["ours"] == [] and row["verl"] is None  # verl's validate_config and dataclasses accept the export


def test_the_expert_parallel_seed_respects_the_users_pins_and_dense_models():
    from autotune.search.warmstart import expert_parallel_start

    cfg = _moe_cfg()
    for fixed in ({"actor_engine": "fsdp"}, {"actor_engine": "megatron", "actor_ep": 2}):
        space = SearchSpace.build(cfg.model, cfg.workload, gpus_per_node=8, nodes=1, fixed=fixed)
        assert expert_parallel_start(cfg, space, MemoryGate(), samples=100, seed=1) is None
    dense = _cfg()
    space = SearchSpace.build(dense.model, dense.workload, gpus_per_node=8, nodes=1)
    assert expert_parallel_start(dense, space, MemoryGate(), samples=100, seed=1) is None


def test_the_moe_quick_study_probes_ep8_among_its_first_trials(tmp_path):
    import subprocess
    import sys

    import optuna

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen3-30b-a3b", "--gpus", "8",
                           "--backend", "sim", "--trials", "6", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env={"CUDA_VISIBLE_DEVICES": "", **__import__("os").environ})
    assert proc.returncode == 0, proc.stderr
    assert "(EP 8, as verl's MoE recipes)" in proc.stdout
    study = optuna.load_study(study_name="qwen3-30b-a3b-1x8-sim", storage=f"sqlite:///{out / 'autotune.db'}")
    eps = {t.user_attrs["candidate"]["actor_ep"] for t in study.trials if t.user_attrs.get("candidate")}
    assert 8 in eps


def test_the_warm_start_never_spends_a_pick_on_a_near_twin():
    """Issue 34: with 7B seed 2 the third pick differed from the second in gpu_memory_utilization and
    max_num_batched_tokens only; such a point is skipped for the next distinct one."""
    a = Candidate(actor_engine="fsdp", rollout_tp=1, max_num_seqs=1024)
    b = a.with_(actor_engine="fsdp2")
    b_twin = b.with_(gpu_memory_utilization=0.55, max_num_batched_tokens=16384)
    other = a.with_(ppo_micro_batch_size_per_gpu=8)
    w = Workload()
    ranked = [Ranked(100, a, w), Ranked(99, b, w), Ranked(98.5, b_twin, w), Ranked(90, other, w)]
    assert [r.candidate for r in _spread(ranked, 3)] == [a, b, other]
    cfg = _cfg()
    from dataclasses import replace
    cfg = replace(cfg, seed=2)
    space = SearchSpace.build(cfg.model, cfg.workload, gpus_per_node=8, nodes=1)
    from autotune.search.equivalence import near_twins
    picks = [r.candidate.as_params() for r in rank_space(cfg, space, MemoryGate(), keep=3, seed=2)]
    assert len(picks) == 3 and not any(near_twins(p, q) for i, p in enumerate(picks) for q in picks[:i])
