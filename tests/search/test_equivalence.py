from autotune.search.equivalence import canonical_params, config_key
from autotune.spaces.candidate import Candidate


def test_token_budgets_do_not_reach_verl_without_dynamic_batching():
    a = Candidate(use_dynamic_bsz=False, ppo_max_token_len_per_gpu=4096).as_params()
    b = Candidate(use_dynamic_bsz=False, ppo_max_token_len_per_gpu=32768, log_prob_max_token_len_per_gpu=8192).as_params()
    assert config_key(a, True) == config_key(b, True)
    dyn_a, dyn_b = dict(a, use_dynamic_bsz=True), dict(b, use_dynamic_bsz=True)
    assert config_key(dyn_a, True) != config_key(dyn_b, True)


def test_static_micro_batches_megatron_sizes_and_ref_knobs_are_neutral_where_they_do_not_apply():
    base = Candidate(use_dynamic_bsz=True, actor_engine="fsdp").as_params()
    other = dict(base, ppo_micro_batch_size_per_gpu=16, actor_tp=4, actor_pp=2, cuda_device_max_connections=1)
    assert config_key(base, True) == config_key(other, True)
    no_kl = dict(base, ref_param_offload=True)
    assert config_key(base, False) == config_key(no_kl, False)
    assert config_key(base, True) != config_key(no_kl, True)
    megatron = dict(base, actor_engine="megatron", actor_tp=2)
    assert config_key(megatron, True) != config_key(dict(megatron, actor_tp=4), True)
    assert config_key(megatron, True) == config_key(dict(megatron, ulysses_sp=4, activation_offload=True), True)


def test_float_noise_and_tuned_workload_values():
    a = Candidate(gpu_memory_utilization=0.6).as_params()
    b = dict(a, gpu_memory_utilization=0.6000000000000001)
    assert canonical_params(a, True) == canonical_params(b, True)
    assert config_key(a, True, {"ppo_mini_batch_size": 64}) != config_key(a, True, {"ppo_mini_batch_size": 128})
