"""The small search space the benchmark tests enumerate point by point (exact optimum by brute force)."""

SMALL = dict(
    fixed={"use_torch_compile": True, "use_remove_padding": True, "activation_offload": False,
           "enable_chunked_prefill": True, "ref_param_offload": False, "cuda_device_max_connections": 1},
    ranges={"actor_engine": ["fsdp", "megatron"], "actor_tp": [1, 2], "actor_pp": [1, 2], "actor_vpp": [1, 2],
            "actor_cp": [1], "ulysses_sp": [1, 2], "rollout_tp": [1, 2], "gpu_memory_utilization": [0.3, 0.6, 0.9],
            "max_num_seqs": [64, 512], "max_num_batched_tokens": [8192],
            "ppo_micro_batch_size_per_gpu": [1, 8, 64], "log_prob_micro_batch_size_per_gpu": [2, 32],
            "ref_log_prob_micro_batch_size_per_gpu": [4, 128], "ppo_max_token_len_per_gpu": [1536, 12288],
            "log_prob_max_token_len_per_gpu": [3072, 49152]},
)


def each_point(space, workload, values_of):
    """Every point of `space` the sampler can tell apart, once, as (values, active knobs): for each engine and
    batching mode, the knobs active under them over all their values and every other knob at its first value (the
    sampler never varies an inactive knob). The same points as filtering the full product of all values, without
    walking it: 18,432 points instead of 589,824 combinations for SMALL, and active_knobs asked 4 times, not 589,824."""
    import itertools

    names = list(space.domains)
    for engine in values_of(space, "actor_engine"):
        for dynamic in values_of(space, "use_dynamic_bsz"):
            gates = {"actor_engine": engine, "use_dynamic_bsz": dynamic}
            active = set(space.active_knobs(gates, workload)) | set(gates)
            axes = [[gates[n]] if n in gates else values_of(space, n) if n in active else values_of(space, n)[:1]
                    for n in names]
            for combo in itertools.product(*axes):
                yield dict(zip(names, combo)), active
