"""TEST DOUBLE of `python -m autotune.verl.step_switch` (a shared launch, ../README.md): the start-up lines, then
per step what autotune's trainer does (read the schedule, record the switch, announce it) and a verl-format step
whose throughput follows the configuration's micro-batch, or a real CUDA OOM excerpt when the configuration's
ppo_micro_batch_size_per_gpu is AUTOTUNE_DOUBLE_OOM_MICRO, or hangs in step 2 with two grandchildren when
AUTOTUNE_VERL_DOUBLE=spawn. Every invocation is appended to RUN_DIR/../launches.jsonl.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[3] / "verl" / "data" / "verl_failures"
PREFIX = "\x1b[36m(StepSwitchTaskRunner pid=4242)\x1b[0m "


def _arg(prefix):
    return next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(prefix)), None)


def main():
    config_dir = Path(_arg("--config-path"))
    with open(config_dir.parent / "launches.jsonl", "a") as f:
        f.write(json.dumps({"run_dir": str(config_dir), "argv": sys.argv}) + "\n")
    schedule_path = os.environ["AUTOTUNE_STEP_SCHEDULE"]
    plan = json.loads(Path(schedule_path).read_text())
    steps = int(_arg("trainer.total_training_steps"))
    oom_micro = int(os.environ.get("AUTOTUNE_DOUBLE_OOM_MICRO", "0"))
    skip_switch = os.environ.get("AUTOTUNE_DOUBLE_NO_SWITCH") == "1"
    metrics = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)
    print("2026-12-03 10:24:50,077\tINFO worker.py:2038 -- Started a local Ray instance.", flush=True)
    print(PREFIX + "INFO:2026-12-03 10:28:52,134:all initialize finished, ready to fit", flush=True)
    if os.environ.get("AUTOTUNE_DOUBLE_STARTUP_FAIL"):  # a failure excerpt before the first step (the start-up)
        path = sorted(CORPUS.glob(f"{os.environ['AUTOTUNE_DOUBLE_STARTUP_FAIL']}__*.log"))[0]
        sys.stdout.write("".join(l for l in path.read_text().splitlines(True) if not l.startswith("#")))
        sys.exit(1)
    for step in range(1, steps + 1):
        index = plan["steps"][str(step)]
        actor = plan["configs"][index].get("actor", {})
        if not skip_switch:
            with open(schedule_path + ".switches.jsonl", "a") as log:
                log.write(json.dumps({"step": step, "config": index, "held": [plan["configs"][index]]}) + "\n")
            print(PREFIX + f"autotune step switch: step {step} runs configuration {index}", flush=True)
        if os.environ.get("AUTOTUNE_VERL_DOUBLE") == "spawn" and step == 2:  # grandchildren like Ray's, then hang
            for _ in range(2):
                mark = os.environ.get("AUTOTUNE_VERL_DOUBLE_MARK", "")
                subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {mark}"])
            time.sleep(600)
        micro = actor.get("micro_batch_size_per_gpu") or 0
        if oom_micro and micro == oom_micro:  # AUTOTUNE_DOUBLE_FAIL: another failure excerpt there instead
            kind = os.environ.get("AUTOTUNE_DOUBLE_FAIL", "cuda_oom")
            path = sorted(CORPUS.glob(f"{kind}__*.log"))[0]
            sys.stdout.write("".join(l for l in path.read_text().splitlines(True) if not l.startswith("#")))
            sys.stdout.flush()
            sys.exit(1)
        time.sleep(0.05)
        warm = step <= int(os.environ.get("AUTOTUNE_DOUBLE_WARMUP", "1"))  # a cold step is slower
        throughput = 1000.0 + 10 * micro - (500 if warm else 0)
        data = {"training/global_step": step, "timing_s/gen": 1.5, "timing_s/old_log_prob": 0.3,
                "timing_s/ref": 0.3, "timing_s/update_actor": 1.0, "timing_s/update_weights": 0.1,
                "timing_s/step": 3.2, "perf/throughput": throughput, "perf/mfu/actor": 0.3,
                "actor/perf/max_memory_allocated_gb": 10.0 + micro, "actor/perf/max_memory_reserved_gb": 50.0}
        gens = os.environ.get("AUTOTUNE_DOUBLE_GEN")  # per step, comma-separated: a rollout timed on verl's poll grid
        if gens:
            gen = float(gens.split(",")[(step - 1) % len(gens.split(","))])
            train_s, tokens = 8.0 / (1 + micro / 100), 8000.0  # the switched micro-batch drives the training only
            data.update({"timing_s/gen": gen, "timing_s/step": gen + train_s, "perf/total_num_tokens": tokens,
                         "perf/throughput": tokens / (gen + train_s)})
        lengths = os.environ.get("AUTOTUNE_DOUBLE_LENGTHS")  # "prompt mean,response mean": as verl logs them
        if lengths:
            prompt_mean, response_mean = (float(v) for v in lengths.split(","))
            data.update({"prompt_length/mean": prompt_mean, "response_length/mean": response_mean})
        metrics.write((json.dumps({"step": step, "data": data}) + "\n").encode())
        print(PREFIX + " - ".join([f"step:{step}"] + [f"{k}:{v}" for k, v in data.items()]), flush=True)


if __name__ == "__main__":
    main()
