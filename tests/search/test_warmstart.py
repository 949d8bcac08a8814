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
