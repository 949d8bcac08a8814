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

import time
from collections.abc import Callable
from pathlib import Path

import optuna

from autotune.config import TuneConfig
from autotune.errors import BackendUnavailable, ProbeCrashed, ProbeEnvironmentError, ProbeOOM, ProbeRejected, ProbeTimeout
from autotune.backends.base import ProbePruned, ProbeRequest, ProbeRunner, get_runner
from autotune.search import driver, lease

_ERRORS = {"ProbeRejected": ProbeRejected, "ProbeCrashed": ProbeCrashed, "ProbeTimeout": ProbeTimeout,
           "ProbeEnvironmentError": ProbeEnvironmentError}


def _ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("--executor ray needs Ray: pip install 'verl-autotune[ray]'") from None
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


def run_study_ray(cfg: TuneConfig, *, address: str | None = None, max_in_flight: int | None = None,
                  on_trial: Callable | None = None, ray_init_kwargs: dict | None = None) -> optuna.Study:
    """Like driver.run_study, with up to `max_in_flight` probes running at once as Ray tasks."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, **(ray_init_kwargs or {}))
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    runner: ProbeRunner = get_runner(cfg.backend) if cfg.backend == "sim" else _LocalChecks(cfg.backend)
    cfg = driver.fit_to_runner(cfg, runner)
    space, study = driver.start_study(cfg)
    ctx = driver.StudyContext(cfg=cfg, space=space, runner=runner)
    remote = ray.remote(probe_on_worker)
    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    # simulated probes need no GPU; they still reserve them where the cluster has some (fake GPUs in CI), so the
    # placement is exercised exactly as for real probes
    gpus = cfg.gpus_per_node if (cfg.backend != "sim" or cluster_gpus >= cfg.world_size) else 0
    if gpus and cluster_gpus < cfg.world_size:
        raise BackendUnavailable(f"the Ray cluster has {cluster_gpus:g} GPUs; one probe of this job needs "
                                 f"{cfg.world_size}")
    bundles = [{"GPU": gpus, "CPU": 1} if gpus else {"CPU": 1}] * cfg.nodes
    capacity = int(cluster_gpus // cfg.world_size) if gpus else int(ray.cluster_resources().get("CPU", 1) // cfg.nodes)
    slots = max(min(max_in_flight or capacity, capacity), 1)
    pending: dict = {}
    beats: dict[int, lease.Heartbeat] = {}
    started_s = time.monotonic()
    try:
        while True:
            stop = driver.budget_left(cfg, study, started_s)
            room = driver.finished_count(study) + len(pending) < cfg.trials and stop is None
            while room and len(pending) < slots:
                driver.propose_from_model(study, cfg, space)
                trial = study.ask()
                prepared = driver.prepare_trial(ctx, study, trial)
                if prepared is None:
                    _announce(study, trial, on_trial)
                else:
                    request, ratio = prepared
                    pg = placement_group(bundles, strategy="STRICT_SPREAD" if cfg.nodes > 1 else "PACK")
                    ref = remote.options(num_cpus=1, num_gpus=gpus, scheduling_strategy=
                                         PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                          placement_group_bundle_index=0)
                                         ).remote(cfg.backend, request)
                    pending[ref] = (trial, request, ratio, pg)
                    beats[trial.number] = lease.Heartbeat(trial).start()  # other tuners see it is alive
                room = driver.finished_count(study) + len(pending) < cfg.trials and \
                    driver.budget_left(cfg, study, started_s) is None
            if not pending:
                if stop:
                    study.set_user_attr("stopped_by", stop)
                break
            done, _ = ray.wait(list(pending), num_returns=1)
            trial, request, ratio, pg = pending.pop(done[0])
            beats.pop(trial.number).stop()
            doc = ray.get(done[0])
            remove_placement_group(pg)
            driver._keep_probe_log(study, trial, Path(request.run_dir))
            driver.record_outcome(study, trial, ratio, result=doc.get("result"), error=outcome_error(doc))
            _announce(study, trial, on_trial)
    except BaseException:
        for beat in beats.values():
            beat.stop()
        for trial, _, _, pg in pending.values():  # interrupted: nothing left RUNNING, no GPU held
            trial.set_user_attr("state", "failed")
            trial.set_user_attr("reason", "interrupted by the user")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            remove_placement_group(pg)
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return study


def _announce(study: optuna.Study, trial: optuna.Trial, on_trial: Callable | None) -> None:
    if on_trial:
        on_trial(study.trials[trial.number])


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
