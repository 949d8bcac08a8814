"""Issue 15's defects at the user's level, on an old checkout and on this one: each defect is a small verl launch
script given to the CLI (`autotune run --backend sim --from ... ; best.yaml`, or `autotune estimate --from ... --json`)
in a subprocess whose PYTHONPATH is the checkout under test; every best.yaml is then judged by verl 0.9.1's own
start-up checks through THIS checkout's judge (autotune/verl/judge.py). Prints, per defect, the old and the new
result. Output kept in benchmarks/results/defects_before_after.txt.

    git archive a03a453 | tar -x -C /tmp/old   # the commit before autotune/verl/keys.py appeared
    python benchmarks/defects_before_after.py /tmp/old [--new .]

Defect 7 (failure classification) is shown by calling each checkout's classifier on the log lines of
tests/verl/test_defects.py (no CLI command reads a probe log without a GPU); defect 8 (CUDA_VISIBLE_DEVICES under NVML)
needs NVIDIA GPUs and is not shown here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ARO = "actor_rollout_ref"
REPO = Path(__file__).resolve().parents[1]


def script(*overrides: str, model: str = "Qwen/Qwen2.5-7B-Instruct", gpus: int = 8) -> str:
    lines = ["python3 -m verl.trainer.main_ppo", "algorithm.adv_estimator=grpo", f"{ARO}.model.path={model}",
             "data.train_batch_size=64", f"{ARO}.actor.ppo_mini_batch_size=16", f"{ARO}.rollout.n=4",
             "data.max_prompt_length=512", "data.max_response_length=1024",
             f"trainer.n_gpus_per_node={gpus}", "trainer.nnodes=1", *overrides]
    return " \\\n    ".join(lines) + "\n"


MICRO = (f"{ARO}.actor.ppo_micro_batch_size_per_gpu=2", f"{ARO}.rollout.log_prob_micro_batch_size_per_gpu=4",
         f"{ARO}.ref.log_prob_micro_batch_size_per_gpu=4")
MEGATRON = ("model_engine=megatron", f"{ARO}.actor.megatron.tensor_model_parallel_size=2",
            f"{ARO}.ref.megatron.tensor_model_parallel_size=2", f"{ARO}.actor.megatron.use_mbridge=True", *MICRO)
MOE = ("model_engine=megatron", f"{ARO}.actor.megatron.tensor_model_parallel_size=4",
       f"{ARO}.actor.megatron.expert_model_parallel_size=8", *MICRO)


def cli(checkout: Path, workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(checkout), "CUDA_VISIBLE_DEVICES": "", "HOME": "/home/user"}
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=600)


def last_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return text[-1][:160] if text else f"exit {proc.returncode}"


def run_and_judge(checkout: Path, text: str, *extra: str, tune: dict | None = None) -> tuple[dict | None, str]:
    """(best.yaml as a dict, or None; verl's verdict on it or why there is none), trial 0 only: the user's job."""
    from autotune.verl.compose import compose_exported
    from autotune.verl.judge import verdict_config

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "job.sh").write_text(text)
        args = ["run", "--backend", "sim", "--from", "job.sh", "--trials", "1", "--out", "out", "--gpu", "H100-80GB",
                *extra]
        if tune is not None:
            (work / "tune.yaml").write_text(yaml.safe_dump(tune))
            args += ["--config", "tune.yaml"]
        proc = cli(checkout, work, *args)
        best = work / "out" / "best.yaml"
        if proc.returncode != 0 or not best.is_file():
            return None, f"no export (exit {proc.returncode}): {last_line(proc)}"
        doc = yaml.safe_load(best.read_text())
        try:
            verdict = verdict_config(compose_exported(best), private=True)
        except Exception as exc:  # Hydra refusing an unknown key
            verdict = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return doc, "verl accepts it" if verdict is None else f"verl refuses it: {verdict[:150]}"


def estimate_json(checkout: Path, text: str, *extra: str) -> dict | str:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "job.sh").write_text(text)
        proc = cli(checkout, work, "estimate", "--from", "job.sh", "--json", *extra)
        if proc.returncode != 0:
            return f"exit {proc.returncode}: {last_line(proc)}"
        return json.loads(proc.stdout)


def get(doc: dict | None, dotted: str):
    node = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "(not set)"
        node = node[part]
    return node


def defect_1(checkout: Path) -> str:
    doc, verdict = run_and_judge(checkout, script("algorithm.use_kl_in_reward=True", f"{ARO}.actor.use_kl_loss=False",
                                                  *MICRO))
    return f"ref micro-batch exported: {get(doc, f'{ARO}.ref.log_prob_micro_batch_size_per_gpu')}; {verdict}"


def defect_2(checkout: Path) -> str:
    text = script(*MICRO, f"{ARO}.rollout.gpu_memory_utilization=0.3", f"{ARO}.rollout.tensor_model_parallel_size=1",
                  model="meta-llama/Llama-3.1-8B-Instruct")
    doc, verdict = run_and_judge(checkout, text)
    est = estimate_json(checkout, text, "--gpu", "H100-80GB")
    if isinstance(est, str):
        return est
    exported = get(doc, f"{ARO}.rollout.max_model_len")
    # unset, verl gives vLLM the model's max_position_embeddings (vllm_async_server.py:1103-1105): 131072 for Llama 3.1
    runs_with = 131072 if exported in ("(not set)", None) else exported
    needed = est["kv_cache_needed_gib"] / 1536 * runs_with  # KV bytes per token x tokens (prompt + response = 1536)
    outcome = "vLLM refuses to start" if needed > est["kv_cache_gib"] else "fits"
    return (f"rollout.max_model_len exported: {exported}, so vLLM runs with {runs_with}: one sequence needs "
            f"{needed:.2f} GiB of KV, the cache has {est['kv_cache_gib']:.1f}: {outcome}; autotune's estimate said "
            f"{est['kv_cache_needed_gib']:.2f} needed; {verdict}")


def defect_3(checkout: Path) -> str:
    doc, verdict = run_and_judge(checkout, script(*MEGATRON))
    key = f"{ARO}.actor.megatron.override_transformer_config.recompute_granularity"
    return f"the job sets no recompute; its trial-0 export has recompute_granularity: {get(doc, key)}; {verdict}"


def defect_4(checkout: Path) -> str:
    est = estimate_json(checkout, script(*MOE, model="Qwen/Qwen3-30B-A3B"), "--gpu", "H100-80GB")
    if isinstance(est, str):
        return est
    return f"expert TP unset, TP 4, EP 8: weights {est['components_gib']['weights']:.1f} GiB per GPU"


def defect_5(checkout: Path) -> str:
    peaks = []
    for compile_on in (True, False):
        est = estimate_json(checkout, script(*MEGATRON, f"{ARO}.actor.use_torch_compile={compile_on}"),
                            "--gpu", "H100-80GB")
        if isinstance(est, str):
            return est
        peaks.append(est["phase_peak_gib"]["old_log_prob"])
    return (f"Megatron job, use_torch_compile True vs False (verl's Megatron engine reads neither): old_log_prob peak "
            f"{peaks[0]:.1f} vs {peaks[1]:.1f} GiB")


def defect_6(checkout: Path) -> str:
    path = REPO / "tests" / "data" / "verl_examples" / "qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh"
    est = estimate_json(checkout, path.read_text(), "--gpu", "H100-80GB")
    if isinstance(est, str):
        return est
    micro = (est["largest_fitting"].get("ppo_micro_batch_size_per_gpu") or {}).get("current", "?")
    return (f"qwen2-14b LoRA script (ppo_micro_batch_size=116 global, 2 GPUs, Ulysses SP 2; verl: 116 / (2 / 2) = 116 "
            f"per GPU): imported {micro} per GPU")


DEFECT_7_LOGS = {
    "sglang CUresult OOM": "in generate_sequences\nRuntimeError: CUresult error: 2 (out of memory)\n",
    "ConfigKeyError": "omegaconf.errors.ConfigKeyError: Key 'megatron' not in 'FSDPActorConfig'\n    full_key: megatron\n",
    "OOM then later lines": "(WorkerDict pid=1) step 0: generate_sequences\ntorch.OutOfMemoryError: CUDA out of memory. "
                            "Tried to allocate 2.00 GiB\n(WorkerDict pid=2) update_actor: waiting for peers\n"
                            "(TaskRunner pid=3) shutting down after update_policy\n",
}


def defect_7(checkout: Path) -> str:
    # the module this checkout has (an editable install may add another checkout's autotune to the package path)
    module = ("autotune.verl.failures" if (checkout / "autotune" / "verl" / "failures.py").is_file()
              else "autotune.objectives.verl_failures")
    code = ("import json, sys\n"
            f"from {module} import classify_failure\n"
            "logs = json.loads(sys.stdin.read())\n"
            "print(json.dumps({k: [classify_failure(1, v).kind.value, classify_failure(1, v).phase] "
            "for k, v in logs.items()}))\n")
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    # cwd outside any checkout: `python -c` puts the working folder first on sys.path
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(DEFECT_7_LOGS), env=env, capture_output=True,
                          text=True, timeout=120, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        return last_line(proc)
    found = json.loads(proc.stdout)
    return "; ".join(f"{name}: {kind}" + (f" in {phase}" if name.startswith("OOM") else "")
                     for name, (kind, phase) in found.items())


def defect_9(checkout: Path) -> str:
    doc, verdict = run_and_judge(checkout, script(*MEGATRON), tune={"fixed": {"actor_engine": "fsdp"}})
    left = sorted(k for k in _flat(doc or {}) if ".megatron." in k)
    return f"Megatron job pinned to FSDP: Megatron keys left in the export: {left or 'none'}; {verdict}"


def _flat(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


DEFECTS = {"1 in-reward KL needs the reference": defect_1, "2 rollout.max_model_len": defect_2,
           "3 Megatron recompute imported": defect_3, "4 expert TP null means TP": defect_4,
           "5 knobs verl does not read": defect_5, "6 global micro-batch with Ulysses SP": defect_6,
           "7 failure classification": defect_7, "9 engine switch": defect_9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="a checkout of the code before issue 15's fixes")
    parser.add_argument("--new", type=Path, default=REPO, help="the checkout after them (default: this one)")
    parser.add_argument("--only", nargs="*", default=None, help="defect numbers to show (default: all)")
    args = parser.parse_args()
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}; old: "
          f"{args.old.resolve()}, new: {args.new.resolve()}; verl judge from {REPO}")
    for name, fn in DEFECTS.items():
        if args.only is not None and name.split()[0] not in args.only:
            continue
        print(f"defect {name}")
        for label, checkout in (("old", args.old.resolve()), ("new", args.new.resolve())):
            print(f"  {label}: {fn(checkout)}", flush=True)
    print("defect 8 CUDA_VISIBLE_DEVICES under NVML: not shown (needs NVIDIA GPUs)")


if __name__ == "__main__":
    main()
