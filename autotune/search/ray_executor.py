"""`--executor ray`: several probes in flight on a Ray cluster, one shared Optuna study.

Why plain Ray tasks driven by the study rather than Ray Tune: the study already owns everything a trial
needs (verl's rules, the memory gate, OOM boundaries, the recalibrated model's proposals, constraints
taught to TPE, resume after a crash); Ray Tune's OptunaSearch would put a second loop between Optuna and
the probes and lose the constraint mechanism (reference/optuna-ray.md, section 8). Ray here only places
probes: each one reserves the GPUs its candidate's job needs, through a placement group of one bundle per
node (`STRICT_SPREAD`, so a multi-node job gets whole nodes) and runs the backend's probe on the first
bundle's node. Pruning needs per-step reports in the driver and is not done for remote probes.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna

from autotune.errors import install_hint
from autotune.config import TuneConfig
from autotune.errors import BackendUnavailable, ProbeCrashed, ProbeEnvironmentError, ProbeOOM, ProbeRejected, ProbeTimeout
from autotune.backends.base import ProbePruned, ProbeRequest, ProbeRunner, get_runner
from autotune.search.driver import run_study
from autotune.search.executor import Finished, Launch, Report

_ERRORS = {"ProbeRejected": ProbeRejected, "ProbeCrashed": ProbeCrashed, "ProbeTimeout": ProbeTimeout,
           "ProbeEnvironmentError": ProbeEnvironmentError}


def _ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailable(f"--executor ray needs Ray: {install_hint('ray')}") from None
    return ray


def probe_on_worker(backend: str, request: ProbeRequest) -> dict:
    """Runs inside a Ray task: one probe, its outcome as plain data (exceptions do not cross Ray whole)."""
    runner = get_runner(backend)
    try:
        result = runner.probe(request, lambda step, tokens_per_s: False)
    except ProbeOOM as exc:
        return {"error": "ProbeOOM", "message": str(exc), "phase": exc.phase, "over_gib": exc.over_gib,
                "peak_mem_gib": exc.peak_mem_gib, "kind": exc.kind}
    except ProbePruned as exc:
        return {"error": "ProbePruned", "step": exc.step, "tokens_per_s_per_gpu": exc.tokens_per_s_per_gpu}
    except (ProbeRejected, ProbeCrashed, ProbeTimeout, ProbeEnvironmentError) as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"result": result}


def outcome_error(doc: dict) -> Exception | None:
    name = doc.get("error")
    if name is None:
        return None
    if name == "ProbeOOM":
        return ProbeOOM(doc["message"], phase=doc["phase"], over_gib=doc["over_gib"], peak_mem_gib=doc["peak_mem_gib"],
                        kind=doc["kind"])
    if name == "ProbePruned":
        return ProbePruned(doc["step"], doc["tokens_per_s_per_gpu"])
    return _ERRORS[name](doc["message"])


class RayExecutor:
    """Probes as Ray tasks, each in a placement group that reserves its job's GPUs (see the module docstring)."""

    def __init__(self, cfg: TuneConfig, *, max_in_flight: int | None = None) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray, self._backend, self._nodes = ray, cfg.backend, cfg.nodes
        self._placement_group, self._remove = placement_group, remove_placement_group
        self._strategy = PlacementGroupSchedulingStrategy
        self._remote = ray.remote(probe_on_worker)
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        # simulated probes need no GPU; they still reserve them where the cluster has some (fake GPUs in CI), so
        # the placement is exercised exactly as for real probes
        self._gpus = cfg.gpus_per_node if (cfg.backend != "sim" or cluster_gpus >= cfg.world_size) else 0
        if self._gpus and cluster_gpus < cfg.world_size:
            raise BackendUnavailable(f"the Ray cluster has {cluster_gpus:g} GPUs; one probe of this job needs "
                                     f"{cfg.world_size}")
        self._bundles = [{"GPU": self._gpus, "CPU": 1} if self._gpus else {"CPU": 1}] * cfg.nodes
        capacity = (int(cluster_gpus // cfg.world_size) if self._gpus
                    else int(ray.cluster_resources().get("CPU", 1) // cfg.nodes))
        self._slots = max(min(max_in_flight or capacity, capacity), 1)
        self._pending: dict = {}  # Ray object ref -> (launch, placement group)

    def capacity(self) -> int:
        return self._slots

    def in_flight(self) -> int:
        return len(self._pending)

    def shares_launches(self) -> bool:
        return False  # each Ray task runs one probe in its own placement group

    def submit_group(self, launches: list[Launch], reports: list[Report]) -> None:
        for launch, report in zip(launches, reports):
            self.submit(launch, report)

    def submit(self, launch: Launch, report: Report) -> None:  # no per-step reports from remote probes
        pg = self._placement_group(self._bundles, strategy="STRICT_SPREAD" if self._nodes > 1 else "PACK")
        ref = self._remote.options(num_cpus=1, num_gpus=self._gpus, scheduling_strategy=self._strategy(
            placement_group=pg, placement_group_bundle_index=0)).remote(self._backend, launch.request)
        self._pending[ref] = (launch, pg)

    def wait(self) -> list[Finished]:
        done, _ = self._ray.wait(list(self._pending), num_returns=1)
        finished = []
        for ref in done:
            launch, pg = self._pending.pop(ref)
            doc = self._ray.get(ref)
            self._remove(pg)
            finished.append(Finished(launch, result=doc.get("result"), error=outcome_error(doc)))
        return finished

    def cancel(self) -> list[Launch]:
        launches = []
        for ref, (launch, pg) in self._pending.items():  # nothing left holding a GPU
            self._ray.cancel(ref, force=True)
            self._remove(pg)
            launches.append(launch)
        self._pending.clear()
        return launches


def run_study_ray(cfg: TuneConfig, *, address: str | None = None, max_in_flight: int | None = None,
                  on_trial: Callable | None = None, ray_init_kwargs: dict | None = None) -> optuna.Study:
    """driver.run_study with up to `max_in_flight` probes running at once as Ray tasks."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, **(ray_init_kwargs or {}))
    runner: ProbeRunner = get_runner(cfg.backend) if cfg.backend == "sim" else _LocalChecks(cfg.backend)
    return run_study(cfg, runner, executor=RayExecutor(cfg, max_in_flight=max_in_flight), on_trial=on_trial)


class _LocalChecks(ProbeRunner):
    """The driver side of a remote real backend: only the pre-launch check runs here (the probe runs on a
    worker node, where the backend's packages and GPUs are)."""

    simulated = False

    def __init__(self, backend: str) -> None:
        self.name = backend

    def unsupported(self, candidate, workload):
        if self.name == "torch":
            from autotune.backends.torch.runner import unsupported_reason
            return unsupported_reason(candidate, workload)
        return None

    def measurable_choices(self):
        if self.name == "torch":
            from autotune.backends.torch.runner import MEASURABLE_CHOICES
            return MEASURABLE_CHOICES
        return {}

    def probe(self, request, report):  # pragma: no cover - never called: probes run on Ray workers
        raise RuntimeError("remote probes run on Ray workers")
