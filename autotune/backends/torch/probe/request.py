"""request.json, parsed: the job being measured and the probe's own settings."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from autotune.backends.torch.runner import PHASES
from autotune.models import ModelSpec, get_model
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload


@dataclass(frozen=True, kw_only=True)
class WorkloadRequest:
    """request.json, parsed. `gpus_per_node` x `nodes` is the job being measured, which sets dp."""

    model: ModelSpec
    workload: Workload
    candidate: Candidate
    gpus_per_node: int
    nodes: int
    warmup_steps: int
    timed_steps: int
    device: str  # "cuda" or "cpu"
    peak_flops_per_gpu: float
    seed: int
    scale_trajectories: int | None  # trajectories this process handles per step
    device_mem_gib: float | None  # total device memory for vLLM's budget; None: ask the device
    test_raise_oom_in: str | None  # test double: raise torch.OutOfMemoryError in this phase

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout.of(self.candidate, self.workload, gpus_per_node=self.gpus_per_node, nodes=self.nodes)


def parse_request(data: dict) -> WorkloadRequest:
    override = data.get("shape_override") or {}
    # a config.json model has no table entry: its whole spec travels in shape_override (torch_runner)
    model = ModelSpec(**override) if len(override) == len(fields(ModelSpec)) else get_model(data["model"])
    if override:
        model = replace(model, **data["shape_override"])
    scale = data.get("scale") or {}
    oom_phase = data.get("test_raise_oom_in")
    if oom_phase is not None and oom_phase not in PHASES:
        raise ValueError(f"test_raise_oom_in must be one of {PHASES}, but got {oom_phase=}")
    timed_steps = int(data.get("timed_steps", 2))
    if timed_steps < 1:
        raise ValueError(f"timed_steps must be >= 1 (the result is their median), but got {timed_steps=}")
    return WorkloadRequest(
        model=model,
        workload=Workload(**data.get("workload", {})),
        candidate=Candidate(**data.get("candidate", {})),
        gpus_per_node=int(data.get("gpus_per_node", 1)),
        nodes=int(data.get("nodes", 1)),
        warmup_steps=int(data.get("warmup_steps", 1)),
        timed_steps=timed_steps,
        device=data.get("device", "cuda"),
        peak_flops_per_gpu=float(data["peak_flops_per_gpu"]),
        seed=int(data.get("seed", 0)),
        scale_trajectories=scale.get("trajectories"),
        device_mem_gib=data.get("device_mem_gib"),
        test_raise_oom_in=oom_phase,
    )
