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
