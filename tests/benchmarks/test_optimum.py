"""The decomposed exhaustive optimum equals brute force on spaces small enough to enumerate point by point."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.model.calibration import DEFAULT_CONSTANTS
from autotune.model.cost import estimate_step_time
from autotune.model.memory import estimate_memory
from autotune.search.equivalence import layout_key, rollout_key
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from optimum import _Evaluator, _values, best_per_part, exact_optimum  # noqa: E402
from small_space import SMALL, each_point  # noqa: E402
from autotune.spaces.space import SearchSpace
from autotune.workload import Workload


def brute_force(model, gpu, workload, space, gpus_per_node, nodes, constants=DEFAULT_CONSTANTS):
    pairs = brute_force_by_pair(model, gpu, workload, space, gpus_per_node, nodes, constants)
    return max(pairs.values(), key=lambda v: v[0], default=None)


def brute_force_by_pair(model, gpu, workload, space, gpus_per_node, nodes, constants=DEFAULT_CONSTANTS):
    """(actor layout key, rollout setting key) -> (fastest tokens/s/GPU, its point), point by point."""
    best = {}
    names = list(space.domains)
    for values, active in each_point(space, workload, _values):  # each point once: inactive knobs never vary
        neutral = {n: getattr(Candidate(), n) for n in names if n not in active}
        if values["actor_engine"] != "megatron":
            neutral["cuda_device_max_connections"] = 0
            neutral.update({n: 1 for n in ("actor_tp", "actor_pp", "actor_vpp", "actor_cp", "actor_ep", "actor_etp")
                            if n in names})
        cand = Candidate(**{**values, **neutral})
        layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=nodes)
        if check(model, workload, cand, layout):
            continue
        mem = estimate_memory(model, gpu, workload, cand, layout, constants=constants)
        if not mem.fits:
            continue
        tps = estimate_step_time(model, gpu, workload, cand, layout, constants=constants).tokens_per_s_per_gpu
        key = (layout_key(cand.as_params()), rollout_key(cand.as_params()))
        if key not in best or tps > best[key][0]:
            best[key] = (tps, cand)
    return best


@pytest.mark.parametrize("model_name, workload", [
    ("qwen2.5-7b", Workload()),
    ("qwen2.5-1.5b", Workload(train_batch_size=128, ppo_mini_batch_size=32, max_response_length=4096)),
])
def test_decomposition_matches_brute_force(model_name, workload):
    model, gpu = get_model(model_name), get_gpu("H100-80GB")
    space = SearchSpace.build(model, workload, gpus_per_node=8, nodes=1, **SMALL)
    bf = brute_force(model, gpu, workload, space, 8, 1)
    opt = exact_optimum(model, gpu, workload, space, gpus_per_node=8, nodes=1)
    assert bf is not None and opt is not None
    assert opt.tokens_per_s_per_gpu == pytest.approx(bf[0], rel=1e-9)


def test_decomposition_matches_brute_force_under_perturbed_constants():
    model, gpu, workload = get_model("qwen2.5-7b"), get_gpu("H100-80GB"), Workload()
    k = replace(DEFAULT_CONSTANTS, activations=replace(DEFAULT_CONSTANTS.activations, per_h=60.0),
                rollout=replace(DEFAULT_CONSTANTS.rollout, decode_hbm_efficiency=0.5))
    space = SearchSpace.build(model, workload, gpus_per_node=8, nodes=1, **SMALL)
    bf = brute_force(model, gpu, workload, space, 8, 1, constants=k)
    opt = exact_optimum(model, gpu, workload, space, gpus_per_node=8, nodes=1, constants=k)
    assert opt.tokens_per_s_per_gpu == pytest.approx(bf[0], rel=1e-9)


def test_each_pairing_of_layout_and_rollout_setting_matches_brute_force():
    """best_per_part (the bound of benchmarks/layout_rank.py) holds each pairing's own optimum, not only the
    overall one."""
    model, gpu, workload = get_model("qwen2.5-7b"), get_gpu("H100-80GB"), Workload()
    space = SearchSpace.build(model, workload, gpus_per_node=8, nodes=1, **SMALL)
    bf = brute_force_by_pair(model, gpu, workload, space, 8, 1)
    ev = _Evaluator(model, gpu, workload, 8, 1, DEFAULT_CONSTANTS)
    parts = {key: ev(cand)[2].tokens_per_s_per_gpu for key, (_, cand, _) in best_per_part(space, workload, ev).items()}
    assert len(bf) > 4 and set(parts) == set(bf)
    for key, (tps, _) in bf.items():
        assert parts[key] == pytest.approx(tps, rel=1e-9), key
