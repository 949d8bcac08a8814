"""Why three LoRA + Ulysses SP 2 scripts from verl's device_tuning.rst are predicted to OOM (the strict xfails in
tests/verl/test_job_import.py): the memory model checks every response at max_response_length, and prints here the
longest response (every one that long) with which each script's own configuration still fits on an H100-80GB, with
the workload's default prompt fill and with GSM8K's prompts (74 tokens on average, measured in
benchmarks/results/h200-2026-12-03-verl/train.txt). Output kept in benchmarks/results/lora_sp2_lengths.txt.

    python benchmarks/lora_sp2_lengths.py
"""

from __future__ import annotations

import datetime
import platform
from dataclasses import replace
from pathlib import Path

from autotune.estimate import estimate
from autotune.hardware import get_gpu
from autotune.verl.job_import import user_job
from autotune.verl.launch_script import import_launch_script

EXAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_examples"
SCRIPTS = ("qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh", "qwen2-32b_grpo-lora_4_h100_fsdp_vllm.sh",
           "qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh")
GSM8K_PROMPT_TOKENS = 74  # prompt_length/mean 72-74 in benchmarks/results/h200-2026-12-03-verl/train.txt


def main() -> None:
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}; estimate only")
    gpu = get_gpu("H100-80GB")
    for name in SCRIPTS:
        job = user_job(import_launch_script(EXAMPLES / name, {"HOME": "/home/user"}))
        base, workload = job.baseline, job.workload

        def peak(response: int, fill: float):
            wl = replace(workload, prompt_fill=fill, max_response_length=response)
            return estimate(job.model, gpu, wl, base, gpus_per_node=job.gpus_per_node, nodes=1)

        at_max = peak(workload.max_response_length, workload.prompt_fill)
        longest = {fill: max((r for r in range(64, workload.max_response_length + 1, 8) if peak(r, fill).fits),
                             default=None)
                   for fill in (workload.prompt_fill, GSM8K_PROMPT_TOKENS / workload.max_prompt_length)}
        default_fill, gsm8k_fill = longest.values()
        print(f"{name}: micro-batch {base.ppo_micro_batch_size_per_gpu}/GPU, Ulysses SP {base.ulysses_sp}, "
              f"{job.gpus_per_node} GPUs; every response at max {workload.max_response_length}: update_actor "
              f"{at_max.phase_peak_gib['update_actor']:.1f} GiB of {at_max.capacity_gib:.1f}; fits with every response "
              f"<= {default_fill} tokens (prompt fill {workload.prompt_fill}), <= {gsm8k_fill} (GSM8K prompts, "
              f"{GSM8K_PROMPT_TOKENS} tokens)")


if __name__ == "__main__":
    main()
