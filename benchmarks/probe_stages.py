"""Where a real verl probe's time goes (issue 28 item 1): the start-up stages and steps of every probe of the two H200
studies of 2026-12-03 (benchmarks/results/h200-2026-12-03-verl*/trialN-probe.log), read by autotune/verl/stages.py
from the timestamps the lines carry, as seconds and as a share of the probe.

The logs' first timestamp is Ray's (its token line); what comes before it (the process start, Hydra, verl's config
check) and after the last step line (teardown, the tuner's bookkeeping, the next launch) shows as the gap between
one probe's last step and the next probe's first stamp. Output: benchmarks/results/probe_stages.txt.

    python benchmarks/probe_stages.py
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from pathlib import Path

from autotune.verl.stages import STAGES, stage_durations, stages_from_log

RESULTS = Path(__file__).resolve().parent / "results"
STAMP = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})")
# what a launch re-does today, and what a shared launch or a kept Ray cluster would not (issue 28 items 2-3)
REUSE = {
    "launch -> ray_up": "per launch: python, Hydra, verl's config check (a kept Ray cluster: not Ray's start)",
    "ray_up -> dataloader": "per launch: the TaskRunner actor imports verl/torch, tokenizer and dataset",
    "dataloader -> workers_created": "per launch: worker processes",
    "workers_created -> engines_ready": "per launch: checkpoint load (page cache warm after the first) and FSDP wrap",
    "engines_ready -> vllm_ready": "per launch: vLLM server, weights, profile run, KV cache (eager: no CUDA graphs)",
    "vllm_ready -> rollout_ready": "per launch: the other rollout servers",
    "rollout_ready -> ready_to_fit": "per launch: sleep the rollout, load the trainer checkpoint",
    "ready_to_fit -> step1": "per configuration: warm-up step (the first generation, allocator growth)",
    "step1 -> step2": "per configuration: the timed step",
}


def first_stamp(path: Path) -> dt.datetime | None:
    for line in path.read_text(errors="replace").splitlines():
        if match := STAMP.search(line):
            return dt.datetime.fromisoformat(f"{match.group(1)}.{match.group(2)}")
    return None


def main() -> int:
    rows = []
    for study in sorted(RESULTS.glob("h200-2026-12-03-verl*")):
        logs = sorted(study.glob("trial*-probe.log"), key=lambda p: int(p.name[5:].split("-")[0]))
        starts = [first_stamp(p) for p in logs]
        for k, path in enumerate(logs):
            seconds = stages_from_log(path)
            gap = None
            if k + 1 < len(logs) and "step2" in seconds:
                gap = (starts[k + 1] - starts[k]).total_seconds() - seconds["step2"]
            rows.append((f"{study.name}/{path.name}", seconds, gap))
    print("seconds from the log's first stamp (Ray's); gap: last step to the next probe's first stamp")
    names = [s.name for s in STAGES] + ["step1", "step2"]
    print(f"{'probe':44s} " + " ".join(f"{n[:12]:>12s}" for n in names) + f" {'gap':>6s}")
    for name, seconds, gap in rows:
        print(f"{name:44s} " + " ".join(f"{seconds[n]:12.1f}" if n in seconds else f"{'-':>12s}" for n in names)
              + (f" {gap:6.0f}" if gap is not None else f" {'-':>6s}"))
    complete = [(seconds, gap) for _, seconds, gap in rows if "step2" in seconds]
    print(f"\nmedian over the {len(complete)} probes that ran both steps (the others OOMed on purpose), seconds:")
    spans = {}
    for seconds, _ in complete:
        for span, value in stage_durations(seconds):
            spans.setdefault(span, []).append(value)
    gaps = [gap for _, gap in complete if gap is not None]
    total = sum(statistics.median(v) for v in spans.values()) + (statistics.median(gaps) if gaps else 0.0)
    for span, values in spans.items():
        median = statistics.median(values)
        print(f"  {span:34s} {median:7.1f}  {100 * median / total:4.1f}%  {REUSE.get(span, '')}")
    if gaps:
        print(f"  {'last step -> next launch + pre-Ray':34s} {statistics.median(gaps):7.1f}  "
              f"{100 * statistics.median(gaps) / total:4.1f}%  per launch: teardown, the tuner, the next process start")
    timed = statistics.median(spans["step1 -> step2"])
    print(f"  {'a probe, launch to launch':34s} {total:7.1f}  the timed step is {100 * timed / total:.0f}% of it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
