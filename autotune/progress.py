"""Live progress of a study while it runs: trials done, best so far, the current probe, failures by kind.

On a terminal it is a rich Live panel with each finished trial printed above it; anywhere else (pipes,
CI logs, nohup) it degrades to plain lines: one per finished trial, step lines at most every
`step_interval_s`, and one summary line at the end.

    with RunProgress(total_trials=cfg.trials, study_name=cfg.study_name, simulated=runner.simulated) as progress:
        progress.preload(study.trials)                      # optional: a resumed study's earlier trials
        run_study(cfg, runner, on_trial=progress.on_trial)  # and report(step, tps) -> progress.on_step(...)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.live import Live
from rich.table import Table

from autotune.storage.records import is_result
from autotune.storage.records import TrialRecord
from autotune.ui import trial_line

# autotune's outcome names for trials that did not give a result (records.py); FAIL is the tuner's own fault.
FAILURE_KINDS = ("rejected", "oom", "inferred_oom", "pruned", "failed")


class RunProgress:
    """Context manager fed by the study driver: `on_trial` after each trial, `on_step` during a probe."""

    def __init__(self, total_trials: int, *, study_name: str = "", simulated: bool = False,
                 warmup_steps: int | None = None, console: Console | None = None, quiet: bool = False,
                 step_interval_s: float = 30.0, baseline_label: str = "verl default",
                 final_summary: bool = True) -> None:
        if total_trials < 1:
            raise ValueError(f"total_trials must be at least 1, but got {total_trials=}")
        self.total_trials = total_trials
        self.study_name = study_name
        self.simulated = simulated
        self.warmup_steps = warmup_steps
        self.quiet = quiet
        self.baseline_label = baseline_label
        self.final_summary = final_summary  # False: the caller prints the stored study's summary instead
        self.step_interval_s = step_interval_s
        self.console = console or Console(highlight=False)
        self.live_mode = self.console.is_terminal
        self.done = 0
        self.failures: Counter[str] = Counter()
        self.best: TrialRecord | None = None
        self.baseline: TrialRecord | None = None
        self.current: dict | None = None  # {trial, step, tokens_per_s, phase}
        self._live: Live | None = None
        self._last_step_line_s = float("-inf")

    # ---- context manager ----------------------------------------------------------------------------
    def __enter__(self) -> "RunProgress":
        if self.live_mode:
            self._live = Live(self, console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.current = None
        if self._live is not None:
            self._live.update(self, refresh=True)
            self._live.__exit__(*exc)
            self._live = None
        elif not self.quiet and self.final_summary and exc[0] is None:  # no status line above an error
            self.console.print(self.summary_line(), markup=False, highlight=False, soft_wrap=True)

    # ---- events ---------------------------------------------------------------------------------------
    def preload(self, trials: Iterable[optuna.trial.FrozenTrial]) -> None:
        """Count a resumed study's finished trials without printing them."""
        for t in trials:
            if t.state.is_finished():
                self._count(t)

    def on_trial(self, trial: optuna.trial.FrozenTrial) -> None:
        self._count(trial)
        if self.current is not None and self.current["trial"] == trial.number:
            self.current = None
        if not self.quiet:
            self.console.print(f"[{self.done}/{self.total_trials}] {trial_line(trial)}", markup=False,
                               highlight=False, soft_wrap=not self.live_mode)
        self._refresh()

    def on_step(self, trial_number: int, step: int, tokens_per_s: float, *, phase: str | None = None) -> None:
        """A probe finished `step` (1-based) at `tokens_per_s` tokens/s/GPU; `phase` defaults to warm-up/timed."""
        if phase is None and self.warmup_steps is not None:
            phase = "warm-up" if step <= self.warmup_steps else "timed"
        self.current = {"trial": trial_number, "step": step, "tokens_per_s": tokens_per_s, "phase": phase}
        if self.live_mode:
            self._refresh()
            return
        now = time.monotonic()
        if self.quiet or now - self._last_step_line_s < self.step_interval_s:
            return
        self._last_step_line_s = now
        self.console.print(f"  trial {trial_number} {self._current_text()}", markup=False, highlight=False,
                           soft_wrap=True)

    # ---- state ----------------------------------------------------------------------------------------
    def _count(self, t: optuna.trial.FrozenTrial) -> None:
        rec = TrialRecord.of(t)
        self.done += 1
        if t.state == TrialState.FAIL:
            self.failures["failed"] += 1
        elif rec.state in FAILURE_KINDS:
            self.failures[rec.state] += 1
        if not is_result(t):
            return
        if rec.baseline:
            self.baseline = rec
        if self.best is None or rec.tokens_per_s_per_gpu > self.best.tokens_per_s_per_gpu:
            self.best = rec

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self, refresh=True)

    def _current_text(self) -> str:
        c = self.current
        phase = f"{c['phase']} " if c.get("phase") else ""
        return f"{phase}step {c['step']}: {c['tokens_per_s']:.0f} tok/s/GPU"

    def best_text(self) -> str:
        if self.best is None:
            return "none yet"
        text = f"{self.best.tokens_per_s_per_gpu:.0f} tok/s/GPU (trial {self.best.number})"
        if self.baseline is not None and self.baseline.tokens_per_s_per_gpu:
            text += f", x{self.best.tokens_per_s_per_gpu / self.baseline.tokens_per_s_per_gpu:.2f} vs {self.baseline_label}"
        return text

    def failures_text(self) -> str:
        return ", ".join(f"{kind} {self.failures[kind]}" for kind in FAILURE_KINDS)

    def summary_line(self) -> str:
        sim = " SIMULATED" if self.simulated else ""
        name = f"{self.study_name}: " if self.study_name else ""
        return (f"{name}{self.done}/{self.total_trials} trials done{sim}; best {self.best_text()}; "
                f"failures: {self.failures_text()}")

    def __rich__(self) -> Table:
        title = f"autotune {self.study_name}".rstrip()
        if self.simulated:
            title += " (SIMULATED by the calibrated model)"
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("trials done", f"{self.done}/{self.total_trials}")
        table.add_row("best so far", self.best_text())
        probe = "-" if self.current is None else f"trial {self.current['trial']}, {self._current_text()}"
        table.add_row("current probe", probe)
        table.add_row("failures", self.failures_text())
        outer = Table(title=title, show_header=False, show_edge=True, expand=False)
        outer.add_column()
        outer.add_row(table)
        return outer

