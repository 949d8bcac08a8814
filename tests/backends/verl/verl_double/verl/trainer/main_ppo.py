"""TEST DOUBLE of verl.trainer.main_ppo (see ../../README.md): prints verl-format steps or a real failure."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[5] / "verl" / "data" / "verl_failures"  # tests/verl/data
FAILURE_FILES = {"oom": "cuda_oom", "kv": "kv_cache_too_small", "config": "config_rejected",
                 "env": "environment", "nccl": "nccl"}


def _arg(prefix):
    return next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(prefix)), None)


def _excerpt(kind):
    path = sorted(CORPUS.glob(f"{FAILURE_FILES[kind]}__*.log"))[0]
    return "".join(line for line in path.read_text().splitlines(True) if not line.startswith("#"))


def main():
    scenario = os.environ.get("AUTOTUNE_VERL_DOUBLE", "ok")
    config_dir = Path(_arg("--config-path"))
    (config_dir / "double_invocation.json").write_text(json.dumps({"argv": sys.argv, "env": dict(os.environ)}))
    steps = int(_arg("trainer.total_training_steps") or 3)
    metrics_path = os.environ.get("VERL_FILE_LOGGER_PATH") or os.devnull
    metrics = open(metrics_path, "wb", buffering=0)  # verl opens it "wb" too
    prefix = "\x1b[36m(TaskRunnerV1 pid=4242)\x1b[0m "
    print("(TaskRunnerV1 pid=4242) Using LocalLogger is deprecated", flush=True)
    # the start-up lines Ray, verl and vLLM print (from benchmarks/results/h200-2026-12-03-verl-2/trial0-probe.log)
    for line in ("2026-12-03 10:24:50,077\tINFO worker.py:2038 -- Started a local Ray instance.",
                 prefix + "INFO:2026-12-03 10:25:50,413:train and validate dataloader initialized, train dataset size: 64",
                 prefix + "INFO:2026-12-03 10:25:53,913:create worker group dict_keys(['actor_rollout_ref'])",
                 prefix + "INFO:2026-12-03 10:26:32,580:actor and ref model engine initialized",
                 "\x1b[36m(vLLMHttpServer pid=2818)\x1b[0m (EngineCore pid=2920) INFO 12-03 10:28:47 [core.py:344] init "
                 "engine (profile, create kv cache, warmup model) took 14.61 s",
                 prefix + "INFO:2026-12-03 10:28:52,012:checkpoint engine manager initialized",
                 prefix + "INFO:2026-12-03 10:28:52,134:all initialize finished, ready to fit"):
        print(line, flush=True)
        time.sleep(0.01)
    if scenario == "spawn":  # grandchildren like Ray workers, then hang
        for _ in range(2):
            mark = os.environ.get("AUTOTUNE_VERL_DOUBLE_MARK", "")
            subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {mark}"])
    for step in range(1, steps + 1):
        if scenario in FAILURE_FILES and step == 2:
            sys.stdout.write(_excerpt(scenario))
            sys.stdout.flush()
            sys.exit(1)
        if scenario in ("hang", "spawn") and step == 2:
            time.sleep(600)
        time.sleep(0.05)
        throughput = 1000.0 + 100 * step
        data = {"training/global_step": step, "timing_s/gen": 1.5, "timing_s/old_log_prob": 0.3,
                "timing_s/ref": 0.3, "timing_s/update_actor": 1.0, "timing_s/update_weights": 0.1,
                "timing_s/step": 3.2, "perf/throughput": throughput, "perf/mfu/actor": 0.3 + 0.01 * step,
                "actor/perf/max_memory_allocated_gb": 40.0 + step, "actor/perf/max_memory_reserved_gb": 50.0}
        lengths = os.environ.get("AUTOTUNE_DOUBLE_LENGTHS")  # "prompt mean,response mean": as verl logs them
        if lengths:
            prompt_mean, response_mean = (float(v) for v in lengths.split(","))
            data.update({"prompt_length/mean": prompt_mean, "response_length/mean": response_mean})
        metrics.write((json.dumps({"step": step, "data": data}) + "\n").encode())
        line = " - ".join([f"step:{step}"] + [f"{k}:np.float64({v})" if k.startswith("perf/") else f"{k}:{v}"
                                               for k, v in data.items()])
        print(prefix + line, flush=True)
    if scenario == "slow_exit":
        time.sleep(600)


if __name__ == "__main__":
    main()
