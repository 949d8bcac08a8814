"""Where a study's probes run: the `Executor` protocol the one study loop (driver.run_study) drives.

The loop owns every trial's bookkeeping (ask, lease, rules, memory gate, tell); an executor only runs the
probes it is handed and says when they finish. `InProcess` runs one probe at a time in this process, with
per-step reports (pruning, the progress panel); `search/ray_executor.py` runs several as Ray tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import optuna

from autotune.backends.base import ProbePruned, ProbeRequest, ProbeResult, ProbeRunner
from autotune.errors import ProbeError

Report = Callable[[int, float], bool]  # (step, tokens/s/GPU) -> prune now?


@dataclass(frozen=True)
class Launch:
    """A probe the loop decided to run: its trial, the request, and the model's predicted memory ratio."""

    trial: optuna.Trial
    request: ProbeRequest
    ratio: float


@dataclass(frozen=True)
class Finished:
    """A launch's outcome: a result, or the probe's error (a ProbeError, ProbePruned, or an OSError of its folder)."""

    launch: Launch
    result: ProbeResult | None = None
    error: Exception | None = None


class Executor(Protocol):
    def capacity(self) -> int:
        """How many probes may run at once."""

    def in_flight(self) -> int:
        """Launches submitted and not yet returned by wait()."""

    def submit(self, launch: Launch, report: Report) -> None:
        """Start a probe (an executor that cannot report per step ignores `report`)."""

    def shares_launches(self) -> bool:
        """Whether submit_group runs its launches as one backend launch (ProbeRunner.probe_group)."""

    def submit_group(self, launches: list[Launch], reports: list[Report]) -> None:
        """Start probes that share a restart key (search/groups.py); one launch when shares_launches()."""

    def wait(self) -> list[Finished]:
        """Block until at least one submitted probe has finished; return every finished one."""

    def cancel(self) -> list[Launch]:
        """The tuner is stopping: end every probe still running and return their launches."""


class InProcess:
    """One probe at a time, in this process: submit() runs it to the end, wait() hands back its outcome."""

    def __init__(self, runner: ProbeRunner) -> None:
        self._runner = runner
        self._running: Launch | None = None
        self._done: list[Finished] = []

    def capacity(self) -> int:
        return 1

    def in_flight(self) -> int:
        return len(self._done) + (self._running is not None)

    def submit(self, launch: Launch, report: Report) -> None:
        self._running = launch
        try:
            result = self._runner.probe(launch.request, report)
        except (ProbeError, ProbePruned, OSError) as exc:  # OSError: the run folder (disk full, removed)
            self._done.append(Finished(launch, error=exc))
        else:
            self._done.append(Finished(launch, result=result))
        self._running = None

    def shares_launches(self) -> bool:
        return True

    def submit_group(self, launches: list[Launch], reports: list[Report]) -> None:
        if len(launches) == 1:
            self.submit(launches[0], reports[0])
            return
        # the configuration predicted to need the least memory first: an OOM ends a launch, and what ran before it
        # keeps its measurement
        order = sorted(range(len(launches)), key=lambda i: launches[i].ratio)
        launches, reports = [launches[i] for i in order], [reports[i] for i in order]
        self._running = launches[0]
        try:
            outcomes = self._runner.probe_group([la.request for la in launches], reports)
        except OSError as exc:  # the launch's run folder
            outcomes = [exc] * len(launches)
        for launch, outcome in zip(launches, outcomes):
            if isinstance(outcome, ProbeResult):
                self._done.append(Finished(launch, result=outcome))
            else:
                self._done.append(Finished(launch, error=outcome))
        self._running = None

    def wait(self) -> list[Finished]:
        done, self._done = self._done, []
        return done

    def cancel(self) -> list[Launch]:
        running, self._running = self._running, None
        return [running] if running is not None else []
