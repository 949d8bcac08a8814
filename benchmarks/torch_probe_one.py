"""One torch probe of one candidate on this machine's GPU; prints the result as JSON.

    python benchmarks/torch_probe_one.py --model qwen2.5-7b --set actor_engine=fsdp2 --set use_liger=true
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.errors import ProbeError, ProbeOOM
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import ProbeRequest
from autotune.backends.torch.runner import TorchRunner
from autotune.spaces.space import verl_default_candidate
from autotune.workload import Workload


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen2.5-7b")
    p.add_argument("--train-batch", type=int, default=32)
    p.add_argument("--mini-batch", type=int, default=16)
    p.add_argument("--set", action="append", default=[], help="knob=value over verl's default candidate")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timed", type=int, default=1)
    p.add_argument("--deadline-s", type=float, default=300)
    p.add_argument("--out", type=Path, default=Path("/tmp/probe_one"))
    args = p.parse_args()
    model = get_model(args.model)
    wl = Workload(train_batch_size=args.train_batch, ppo_mini_batch_size=args.mini_batch, rollout_n=4,
                  max_prompt_length=512, max_response_length=128)
    cand = verl_default_candidate(model, wl, gpus_per_node=1, nodes=1)
    for item in args.set:
        key, value = item.split("=", 1)
        current = getattr(cand, key)
        cand = cand.with_(**{key: value.lower() == "true" if isinstance(current, bool) else type(current)(value)})
    req = ProbeRequest(model=model, gpu=get_gpu("H200"), n_gpus=1, nodes=1, workload=wl, candidate=cand,
                       run_dir=args.out, warmup_steps=args.warmup, timed_steps=args.timed)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"candidate": cand.as_params()}
    try:
        r = TorchRunner(device="cuda", deadline_s=args.deadline_s, idle_timeout_s=args.deadline_s).probe(
            req, lambda step, tps: False)
        doc.update(outcome="measured", tokens_per_s_per_gpu=r.tokens_per_s_per_gpu, mfu_update=r.mfu,
                   peak_mem_gib=r.peak_mem_gib, phase_s=r.phase_s,
                   phase_peak_mem_gib=r.extra.get("phase_peak_mem_gib"))
    except ProbeOOM as exc:
        doc.update(outcome=f"OOM in {exc.phase}", peak_mem_gib=exc.peak_mem_gib, message=str(exc)[:300])
    except ProbeError as exc:
        doc.update(outcome=type(exc).__name__, message=str(exc)[:300])
    print(json.dumps(doc, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
