"""The probe interface every backend implements, and the backend registry.

A backend turns (model, GPUs, workload, candidate) into a `ProbeResult`, or raises `ProbeOOM`
(the candidate does not fit) / another `ProbeError`. Backends are looked up by name from a registry
of import paths, so `sim` never imports torch or verl.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from autotune.errors import BackendUnavailable, ProbeError
from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

# report(step, tokens_per_s_per_gpu) -> True when the study says "stop this probe" (pruned).
StepReporter = Callable[[int, float], bool]


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    model: ModelSpec
    gpu: GpuSpec
    n_gpus: int
    nodes: int
    workload: Workload
    candidate: Candidate
    run_dir: Path
    trial_number: int = 0
    warmup_steps: int = 1
    timed_steps: int = 2
    passthrough: dict = field(default_factory=dict)  # the user's other verl keys, exported unchanged
    # the user's own job (--from, trial 0): it runs where they run it, so it is launched even where the memory model
    # predicts an OOM, and a simulator shows that prediction instead of failing the job
    users_job: bool = False
    env: dict = field(default_factory=dict)  # what the user's launch script exports to the job's process
    logprob_loop: bool = False  # verl's per-token log-prob loop where it runs (TuneConfig.logprob_loop)


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    tokens_per_s_per_gpu: float  # verl's perf/throughput: (prompt+response tokens) / step time / GPUs
    mfu: float | None  # verl's perf/mfu/actor (update phase)
    peak_mem_gib: float  # highest device memory any phase reached
    step_s: float
    phase_s: dict[str, float]  # gen, old_log_prob, ref, update_actor, update_weights
    simulated: bool
    series: dict[str, list[float]] = field(default_factory=dict)  # raw per-step figures
    extra: dict = field(default_factory=dict)


class ProbeRunner(ABC):
    """One probe backend. Subclasses set `name` and `simulated` and implement `probe`."""

    name: ClassVar[str]
    simulated: ClassVar[bool] = False

    @property
    def deterministic(self) -> bool:
        """Whether probing a configuration again gives the same score (the sim): nothing to confirm then."""
        return self.simulated

    def unsupported(self, candidate: Candidate, workload: Workload) -> str | None:
        """Why this backend cannot measure `candidate` at all (checked before launch); None when it can."""
        return None

    def measurable_choices(self) -> dict[str, tuple]:
        """Knobs of which this backend can measure only some values, with those values (the torch backend: FSDP
        engines, no Ulysses), so the sampler proposes nothing else. A user's pin outside them is an error."""
        return {}

    def held_off(self) -> dict:
        """Knobs this backend cannot turn on where it runs (a package is missing), with the value they are held
        at, so the sampler spends no trials on them. A user's own `fixed` or `ranges` entry wins."""
        return {}

    # configurations one launch measures when tune.yaml does not say (probe.configs_per_launch)
    default_configs_per_launch: ClassVar[int] = 1

    @abstractmethod
    def probe(self, request: ProbeRequest, report: StepReporter) -> ProbeResult:
        """Measure one candidate; raise ProbeOOM when it does not fit, ProbePruned when told to stop."""

    def can_share(self, request: ProbeRequest) -> bool:
        """Whether probe_group can measure `request` together with others of its restart key in one launch."""
        return False

    def probe_group(self, requests: list[ProbeRequest], reports: list[StepReporter]) -> list:
        """Measure candidates that share a restart key (autotune/verl/step_knobs.py); one outcome per request, in
        order: a ProbeResult or the exception its probe raised. This default runs them one launch each."""
        outcomes: list = []
        for request, report in zip(requests, reports):
            try:
                outcomes.append(self.probe(request, report))
            except (ProbeError, ProbePruned, OSError) as exc:
                outcomes.append(exc)
        return outcomes


def share_launch_wall(outcomes: list, wall_s: float) -> None:
    """Share one launch's wall time among the configurations it decided (a ProbeResult, or the ProbeError of one
    that failed), so a study's GPU time adds up; None stands for a configuration the launch did not reach."""
    decided = [o for o in outcomes if o is not None]
    for outcome in decided:
        if isinstance(outcome, ProbeResult):
            outcome.extra["probe_wall_s"] = wall_s / len(decided)
        else:
            outcome.probe_wall_s = wall_s / len(decided)


class ProbePruned(Exception):
    """Raised by a backend when `report` asked it to stop (the probe was clearly slower)."""

    def __init__(self, step: int, tokens_per_s_per_gpu: float) -> None:
        super().__init__(f"pruned at step {step} ({tokens_per_s_per_gpu:.0f} tokens/s/GPU)")
        self.step = step
        self.tokens_per_s_per_gpu = tokens_per_s_per_gpu


# name -> "module:Class"; imported only when chosen, so heavy extras stay optional.
BACKENDS: dict[str, str] = {
    "sim": "autotune.backends.sim:SimRunner",
    "verl": "autotune.backends.verl.runner:VerlRunner",
    "torch": "autotune.backends.torch.runner:TorchRunner",
}
BACKEND_NAMES = ("auto", "sim", "torch", "verl")


def get_runner(name: str, **kwargs) -> ProbeRunner:
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    module_name, cls_name = BACKENDS[name].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)(**kwargs)
