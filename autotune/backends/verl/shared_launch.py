"""Several configurations in one verl launch (issue 28 item 2): the step plan, the launch, and which steps belong
to which configuration.

The configurations share a restart key (autotune/verl/step_knobs.py); the first one's config is what verl starts
with (probe.yaml, by the same writer as best.yaml), and autotune's trainer (autotune/verl/step_switch.py) sets each
step's per-step knobs from a schedule: the launch's warm-up steps run the first configuration, then each
configuration runs its timed steps. The trainer records every switch and what the workers then hold; a step is
credited to a configuration only when that record says the workers held it.

Members are scored with the launch's rollout: each step's tokens/s as if its gen had taken the launch's median
(scaled by its tokens; autotune/verl/metrics.py with_launch_rollout). They share one vLLM engine whose settings the
switched knobs never touch, and verl times gen on a 2-s poll grid, which made 2-4 s of a 36-51 s step on the H200
(2026-12-05: the exported best scored x1.30 over the job inside the launch, x1.05 in separate launches of both; with
the launch's rollout x1.24 and x1.15). verl's own per-step figures stay in the series, unchanged.

A failure ends the launch. An OOM in a step is that step's configuration's (graded as for a probe of its own):
those measured before it keep their results and a new launch measures the rest. Any other failure (a crash, a
hang, the environment), and any failure before the first step (the start-up every member shares), is given to
every configuration not yet measured, with no new launch: it would likely end that one too. The exception is
verl's refusal of the launch's own config at start-up (its first member's micro-batches): the others launch again.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from autotune.backends.base import ProbeRequest, ProbeResult, StepReporter, share_launch_wall
from autotune.errors import ProbeCrashed, ProbeOOM, ProbeRejected
from autotune.verl.metrics import LAUNCH_ROLLOUT_KEY, launch_rollout, summarize, with_launch_rollout
from autotune.verl.step_knobs import (SCHEDULE_ENV, SWITCH_LOG_SUFFIX, TRAINER_MODE, restart_key, schedule,
                                      step_values)

SCHEDULE_FILE = "step_schedule.json"


# a launch of at least this many configurations times its first one once more at the end: the two timed steps of
# one configuration, apart by the others, measure a step's noise and drift within the launch (issue 28)
REPEAT_FIRST_FROM = 3


def plan_steps(requests: list[ProbeRequest]) -> list[int]:
    """The configuration each step runs (index into `requests`), step 1 first: warm-up, then each one's timed steps,
    then (REPEAT_FIRST_FROM or more configurations) the first one's timed steps again."""
    plan = [0] * requests[0].warmup_steps + [i for i, r in enumerate(requests) for _ in range(r.timed_steps)]
    if len(requests) >= REPEAT_FIRST_FROM:
        plan += [0] * requests[0].timed_steps
    return plan


def probe_group(runner, requests: list[ProbeRequest], reports: list[StepReporter]) -> list:
    """One outcome per request (a ProbeResult or a ProbeError), measured in as few launches as failures allow."""
    keys = {restart_key(r.candidate) for r in requests}
    if len(keys) != 1:
        raise ValueError("configurations of one launch must share a restart key (search/groups.py picks them so)")
    outcomes: list = [None] * len(requests)
    pending = list(range(len(requests)))
    while pending:
        got = one_launch(runner, [requests[i] for i in pending], [reports[i] for i in pending])
        for i, outcome in zip(pending, got):
            outcomes[i] = outcome
        pending = [i for i, outcome in zip(pending, got) if outcome is None]
    return outcomes


def one_launch(runner, requests: list[ProbeRequest], reports: list[StepReporter]) -> list:
    """Launch once; an outcome per request, None for those the launch did not reach (its first is always decided)."""
    from autotune.backends.verl.runner import StepStream, failure_error, probe_command, request_overrides, result_of

    lead = requests[0]
    plan = plan_steps(requests)
    run_dir = Path(lead.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    schedule_path = run_dir / SCHEDULE_FILE
    switch_log = Path(f"{schedule_path}{SWITCH_LOG_SUFFIX}")
    switch_log.unlink(missing_ok=True)
    doc = schedule(plan, [step_values(request_overrides(r)) for r in requests])
    doc["trials"] = [r.trial_number for r in requests]  # for whoever reads the run folder
    schedule_path.write_text(json.dumps(doc, indent=1))
    extra = [f"trainer.v1.trainer_mode={TRAINER_MODE}",
             f"+ray_kwargs.ray_init.runtime_env.env_vars.{SCHEDULE_ENV}='{schedule_path}'"]
    argv, env, metrics_path = probe_command(lead, python=runner.python, entry=runner.shared_entry,
                                            total_steps=len(plan), extra=extra)

    def report(step: int, tokens_per_s: float) -> bool:
        # progress for the configuration that ran the step; a shared launch is not pruned (its steps are others')
        if step <= len(plan):
            reports[plan[step - 1]](step, tokens_per_s)
        return False

    stream = StepStream(metrics_path, lead.warmup_steps, report)
    outcome, samples, log_path = runner.run_launch(lead, argv, env, metrics_path, stream,
                                                   extra_env={SCHEDULE_ENV: str(schedule_path)})
    failed = outcome.returncode != 0 or outcome.hung or outcome.timed_out
    error = failure_error(outcome, log_path) if failed else None
    held = read_switches(switch_log)
    outcomes: list = [None] * len(requests)
    wrong = [s for s in stream.steps if s <= len(plan) and held.get(s) != plan[s - 1]]
    if wrong:  # never credit a step to a configuration the workers did not hold
        crash = ProbeCrashed(f"step {wrong[0]} of a shared launch ran without autotune's step switch "
                             f"(switches seen: {sorted(held.items())}) [log: {log_path}]")
        outcomes = [crash] * len(requests)
        share_launch_wall(outcomes, outcome.wall_s)
        return outcomes
    failing = next((s for s in range(1, len(plan) + 1) if s not in stream.steps), None)
    timed = [stream.steps[s] for s in range(lead.warmup_steps + 1, len(plan) + 1) if s in stream.steps]
    rollout = launch_rollout(timed) if len(requests) > 1 else None
    for i, request in enumerate(requests):
        own = [s for s in range(1, len(plan) + 1) if plan[s - 1] == i and s > lead.warmup_steps]
        if all(s in stream.steps for s in own[:request.timed_steps]):  # the repeat at the end is a bonus
            own = [s for s in own if s in stream.steps]
            outcomes[i] = _result(i, own, plan, lead.warmup_steps, stream, samples, run_dir, requests, log_path,
                                  outcome.wall_s, result_of, rollout)
    if error is not None and failing is not None:
        started = failing in held  # the trainer reached the step: it is that configuration's, not the start-up's
        if started or isinstance(error, ProbeRejected):
            if outcomes[plan[failing - 1]] is None:  # a failed repeat of the first keeps its measured steps
                outcomes[plan[failing - 1]] = error
        alone = (isinstance(error, ProbeOOM) and started) or (isinstance(error, ProbeRejected) and not started)
        if not alone:
            # a crash, hang or environment error says nothing about the next configuration's memory and would
            # likely end its launch too: no launch after it (only an OOM or verl's refusal of the launch's own
            # configuration is that configuration's alone)
            outcomes = [error if o is None else o for o in outcomes]
    elif any(o is None for o in outcomes) and error is None:
        missing = ProbeCrashed(f"verl exited 0 after {len(stream.steps)} of {len(plan)} steps [log: {log_path}]")
        outcomes = [missing if o is None else o for o in outcomes]
    elif error is not None:  # every step was logged, then the process failed (teardown): the results stand
        pass
    share_launch_wall(outcomes, outcome.wall_s)
    return outcomes


def _result(i: int, own: list[int], plan: list[int], warmup: int, stream, samples, run_dir: Path,
            requests: list[ProbeRequest], log_path: Path, wall_s: float, result_of,
            rollout: tuple[float, float] | None = None) -> ProbeResult:
    """Configuration i's result from its own steps; the first configuration's memory includes the warm-up; scored
    with the launch's rollout where there is one (`rollout`: launch_rollout over the launch's timed steps)."""
    steps = ([stream.steps[s] for s in range(1, warmup + 1)] if i == 0 else []) + [stream.steps[s] for s in own]
    summary = summarize(steps, warmup if i == 0 else 0)
    spans = sample_spans(i, own, stream)
    window = None if samples is None else [s for s in samples if any(a <= s.t_s <= b for a, b in spans)]
    extra = {"log_path": str(log_path), "stage_s": stream.stage_s(wall_s),
             "launch": {"run_dir": str(run_dir), "trials": [r.trial_number for r in requests], "index": i,
                        "steps": own, "wall_s": round(wall_s, 2)}}
    series = summary.series.get("perf/throughput") or []
    if i == 0 and len(own) > requests[0].timed_steps and len(series) >= 2:
        # the same configuration timed at the start and at the end of the launch: the step-to-step spread
        extra["launch"]["repeat_spread"] = _spread(series)
    result = result_of(summary, steps, stream, window, extra)
    adjusted = [with_launch_rollout(stream.steps[s].metrics, rollout) for s in own] if rollout else []
    if not adjusted or None in adjusted:
        return result
    launch = {**extra["launch"], "rollout_gen_s": round(rollout[0], 3), "rollout_tokens": rollout[1],
              "measured_tokens_per_s_per_gpu": result.tokens_per_s_per_gpu}
    if "repeat_spread" in launch and len(adjusted) >= 2:
        launch["repeat_spread_at_launch_rollout"] = _spread(adjusted)
    return replace(result, tokens_per_s_per_gpu=statistics.median(adjusted),
                   series={**result.series, LAUNCH_ROLLOUT_KEY: adjusted}, extra={**result.extra, "launch": launch})


def _spread(values: list[float]) -> float:
    """How far apart one configuration's steps are, as a share of their mean."""
    return round((max(values) - min(values)) / statistics.mean(values), 4)


def sample_spans(i: int, own: list[int], stream) -> list[tuple[float, float]]:
    """The times (monotonic s) whose GPU samples are configuration i's: from the switch to each run of its own
    consecutive steps up to the last one's metrics; the first configuration's first run from the launch's start, its
    warm-up included. A run each, not one span from the first to the last: the first configuration's repeat at the
    launch's end would otherwise take every member's peak as its own (H200 2026-12-05: the job, 90.0 GiB over its own
    steps, read 131.4 GiB, the peak of the member at step 11)."""
    runs: list[list[int]] = []
    for step in own:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    spans = []
    for n, run in enumerate(runs):
        if i == 0 and n == 0:
            since = stream.started_s
        else:
            since = stream.switched.get(run[0], (None, stream.arrived_s.get(run[0] - 1, stream.started_s)))[1]
        spans.append((since, stream.arrived_s.get(run[-1], float("inf"))))
    return spans


def read_switches(path: Path) -> dict[int, int]:
    """{step: configuration} the trainer recorded after the workers confirmed it (autotune/verl/step_switch.py)."""
    held: dict[int, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return held
    for line in lines:
        try:
            record = json.loads(line)
            held[int(record["step"])] = int(record["config"])
        except (ValueError, KeyError, TypeError):
            continue
    return held
