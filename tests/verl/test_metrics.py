"""verl metric parsing on real console lines (tests/verl/data/verl_logs, one source per file)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.verl.metrics import (
    JsonlTail,
    StepMetrics,
    parse_console_line,
    summarize,
)

DATA = Path(__file__).parent / "data" / "verl_logs"
FIXTURES = sorted(DATA.glob("*.log"))
STEP_FIXTURES = [p for p in FIXTURES if not p.name.startswith("nonstep_")]
NONSTEP_FIXTURES = [p for p in FIXTURES if p.name.startswith("nonstep_")]


def log_lines(name: str) -> list[str]:
    """A fixture's log lines, without its `#` header lines."""
    text = (DATA / name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if not line.startswith("#")]


def parsed(name: str) -> list[StepMetrics]:
    steps = [parse_console_line(line) for line in log_lines(name)]
    assert all(s is not None for s in steps), name
    return steps  # type: ignore[return-value]


def test_every_fixture_names_its_source():
    assert len(STEP_FIXTURES) >= 6 and len(NONSTEP_FIXTURES) >= 3
    for path in FIXTURES:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# source: "), path.name
        assert log_lines(path.name), path.name


@pytest.mark.parametrize("path", STEP_FIXTURES, ids=lambda p: p.name)
def test_every_real_step_line_parses(path):
    for step in parsed(path.name):
        assert step.step >= 0
        assert len(step.metrics) >= 3
        assert all(isinstance(v, float) for v in step.metrics.values())


@pytest.mark.parametrize("path", NONSTEP_FIXTURES, ids=lambda p: p.name)
def test_real_non_step_lines_are_none(path):
    for line in log_lines(path.name):
        assert parse_console_line(line) is None, line[:80]


def test_docs_quickstart_oldest_format():
    step0, step1 = parsed("docs_quickstart_v0.1.log")
    assert (step0.step, step1.step) == (0, 1)
    assert step0.metrics["timing/gen"] == pytest.approx(21.470)
    assert step0.metrics["actor/pg_loss"] == pytest.approx(-0.005)
    assert step0.metrics["critic/lr(1e-4)"] == pytest.approx(0.1)  # a key with parentheses
    assert step0.metrics["critic/values/min"] == pytest.approx(-14.0)
    assert step1.metrics["prompt_length/min"] == pytest.approx(70.0)  # the last item of the line


def test_issue_2060_val_line_and_unprefixed_memory():
    val, train = parsed("issue_2060_v0.4.log")
    assert val.step == 0
    assert val.metrics == {
        "val-aux/openai/gsm8k/reward/mean@1": 0.565,
        "val-aux/openai/gsm8k/score/mean@1": 0.565,
        "val-core/openai/gsm8k/acc/mean@1": 0.508,
    }
    assert train.step == 1
    assert train.metrics["perf/max_memory_allocated_gb"] == pytest.approx(62.447)
    assert train.metrics["perf/mfu/actor"] == pytest.approx(0.343)
    assert train.metrics["actor/ppo_kl"] == 0.0  # "-0.000"
    assert train.metrics["training/global_step"] == 1.0
    # the copy ends in "prompt_length/m": a cut item is dropped, not misread
    assert not any(key.startswith("prompt_length") for key in train.metrics)


def test_issue_1208_ray_prefixed_v0_3():
    (step,) = parsed("issue_1208_v0.3.log")
    assert step.step == 2
    assert step.metrics["timing_s/gen"] == pytest.approx(74.020)
    assert step.metrics["timing_s/step"] == pytest.approx(96.551)
    assert step.metrics["response_length/clip_ratio"] == pytest.approx(0.004)
    assert "timing_per_token_ms/ref" not in step.metrics  # cut off with no value


def test_issue_316_main_task_prefix_with_markdown_backtick():
    (step,) = parsed("issue_316_v0.1_main_task.log")
    assert step.step == 5
    assert step.metrics["mfu/actor"] == pytest.approx(0.083)
    assert step.metrics["timing_s/update_actor"] == pytest.approx(157.615)


def test_issue_7412_recent_names_and_exponents():
    (step,) = parsed("issue_7412_v0.7_actor_perf.log")
    assert step.step == 34
    assert step.metrics["actor/perf/max_memory_allocated_gb"] == pytest.approx(24.52155876159668)
    assert step.metrics["actor/ppo_kl"] == pytest.approx(-8.163164312320433e-06)
    assert step.metrics["actor/pg_clipfrac_lower"] == pytest.approx(6.1140820869933e-07)
    assert step.metrics["actor/lr"] == pytest.approx(2e-06)
    assert step.metrics["critic/rewards/min"] == -1.0
    assert step.metrics["training/global_step"] == 34.0


def test_numpy2_reprs_parse_to_their_values():
    step71, step72 = parsed("notes_numpy2_v0.5.log")
    assert (step71.step, step72.step) == (71, 72)
    assert step71.metrics["critic/vf_loss"] == pytest.approx(0.007003280876688223)
    assert step71.metrics["actor/pg_loss"] == pytest.approx(-0.0006611689302644663)
    assert step71.metrics["critic/lr"] == pytest.approx(1e-05)
    assert step71.metrics["perf/mfu/actor"] == 0.0
    assert step71.metrics["perf/throughput"] == pytest.approx(1220.4159109515201)
    assert step72.metrics["perf/max_memory_reserved_gb"] == pytest.approx(25.763671875)


def test_numpy2_line_loses_no_item():
    line = log_lines("notes_numpy2_v0.5.log")[0]
    keys = {item.split(":", 1)[0] for item in line.split(" - ")[1:]}
    assert set(parsed("notes_numpy2_v0.5.log")[0].metrics) == keys


def test_ansi_coloured_ray_prefix_gives_the_same_metrics():
    # Ray colours the prefix "\x1b[36m(TaskRunner pid=N)\x1b[0m " (reference/verl.md section 4);
    # GitHub copies drop the ESC byte and keep "[36m". Both must parse like the plain line.
    line = log_lines("notes_numpy2_v0.5.log")[0]
    body = line.split(") ", 1)[1]
    plain = parse_console_line(body)
    for prefix in ("\x1b[36m(TaskRunnerV1 pid=3165)\x1b[0m ", "[36m(TaskRunner pid=3165)[0m "):
        assert parse_console_line(prefix + body) == plain
    assert plain is not None and plain.step == 71


def test_ray_repeat_suffix_does_not_eat_the_last_metric():
    line = log_lines("notes_numpy2_v0.5.log")[0]
    step = parse_console_line(line + " [repeated 2x across cluster]")
    assert step is not None and step.metrics["perf/throughput"] == pytest.approx(1220.4159109515201)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("True", 1.0),
        ("False", 0.0),
        ("np.int64(5)", 5.0),
        ("np.float32(-2.5e-3)", -2.5e-3),
        ("-inf", -math.inf),
        ("1e+20", 1e20),
    ],
)
def test_pprint_reprs(text, expected):
    step = parse_console_line(f"step:3 - k:{text}")
    assert step is not None and step.metrics == {"k": expected}


def test_nan_parses_as_nan():
    step = parse_console_line("step:3 - a:nan - b:np.float64(nan)")
    assert step is not None and math.isnan(step.metrics["a"]) and math.isnan(step.metrics["b"])


@pytest.mark.parametrize(
    "line",
    [
        "",
        "training/global_step:3 - timing_s/step:71.9",
        "Setting global step to 60",
        "step:abc - x:1",
        "step:3 done",
        "step:" + "9" * 5000 + " - x:1",
    ],
)
def test_not_a_step_line(line):
    assert parse_console_line(line) is None


# ---------------------------------------------------------------------------------------------
# JsonlTail
# ---------------------------------------------------------------------------------------------


def record(step: int, data: dict) -> bytes:
    return json.dumps({"step": step, "data": data}).encode() + b"\n"


def test_jsonl_missing_file_is_empty(tmp_path):
    assert JsonlTail(tmp_path / "absent.jsonl").read_new() == []


def test_jsonl_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    real = parsed("notes_numpy2_v0.5.log")[0].metrics
    first, second = record(71, real), record(72, {"perf/throughput": 1248.98})
    path.write_bytes(first + second[:20])  # verl is mid-way through writing step 72
    tail = JsonlTail(path)
    (step71,) = tail.read_new()
    assert step71 == StepMetrics(71, real)
    assert tail.read_new() == []
    with path.open("ab") as fh:
        fh.write(second[20:])
    assert tail.read_new() == [StepMetrics(72, {"perf/throughput": 1248.98})]
    assert tail.read_new() == []


def test_jsonl_null_is_nan_and_garbage_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        b"not json\n",
        b'{"step": 1}\n',
        b'[1, 2]\n',
        b'{"step": true, "data": {"x": 1}}\n',
        b'{"step": 2, "data": {"a": null, "b": 3, "c": "text", "d": [1], "e": false}}\n',
        b"\xff\xfe garbage\n",
    ]
    path.write_bytes(b"".join(lines))
    (step,) = JsonlTail(path).read_new()
    assert step.step == 2
    assert math.isnan(step.metrics["a"])
    assert step.metrics["b"] == 3.0 and step.metrics["e"] == 0.0
    assert "c" not in step.metrics and "d" not in step.metrics


def test_jsonl_file_rewritten_from_scratch_is_read_again(tmp_path):
    # verl opens the file with "wb": a second run at the same path truncates it.
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(record(1, {"x": 1.0}) + record(2, {"x": 2.0}))
    tail = JsonlTail(path)
    assert [s.step for s in tail.read_new()] == [1, 2]
    path.write_bytes(record(1, {"x": 9.0}))
    assert tail.read_new() == [StepMetrics(1, {"x": 9.0})]


# ---------------------------------------------------------------------------------------------
# summarize
# ---------------------------------------------------------------------------------------------


def numpy2_run() -> list[StepMetrics]:
    """Val step 0 plus the real steps 71 and 72 renumbered as training steps 1 and 2."""
    step71, step72 = parsed("notes_numpy2_v0.5.log")
    val = parsed("issue_2060_v0.4.log")[0]
    return [val, StepMetrics(1, step71.metrics), StepMetrics(2, step72.metrics)]


def test_summarize_drops_val_and_warmup():
    summary = summarize(numpy2_run(), warmup_steps=1)
    assert summary.timed_steps == 1
    assert summary.tokens_per_s_per_gpu == pytest.approx(1248.9824178222054)
    assert summary.step_s == pytest.approx(54.416298444382846)
    assert summary.mfu_actor == 0.0
    assert summary.phase_s == {
        "gen": pytest.approx(4.331033235415816),
        "old_log_prob": pytest.approx(5.655994229950011),
        "update_actor": pytest.approx(21.153391116298735),
        "step": pytest.approx(54.416298444382846),
    }
    # legacy unprefixed memory names (this verl predates actor/perf/...)
    assert summary.peak_mem_gib == pytest.approx(20.764535427093506)
    assert summary.reserved_mem_gib == pytest.approx(25.763671875)
    assert summary.series["perf/throughput"] == [pytest.approx(1248.9824178222054)]


def test_summarize_keeps_the_lengths_verl_measured():
    # a real verl log's prompt_length/mean and response_length/mean (the timed step 72): what the node profile prices
    # a probe at (storage/results.measured_workload) instead of the workload's assumed lengths
    summary = summarize(numpy2_run(), warmup_steps=1)
    assert summary.series["prompt_length/mean"] == [pytest.approx(102.1875)]
    assert summary.series["response_length/mean"] == [pytest.approx(163.30078125)]


def test_summarize_medians_over_timed_steps():
    summary = summarize(numpy2_run(), warmup_steps=0)
    assert summary.timed_steps == 2
    assert summary.tokens_per_s_per_gpu == pytest.approx((1220.4159109515201 + 1248.9824178222054) / 2)
    assert len(summary.series["timing_s/step"]) == 2


def test_summarize_prefers_actor_prefixed_memory():
    (step,) = parsed("issue_7412_v0.7_actor_perf.log")
    metrics = {**step.metrics, "perf/throughput": 900.0, "timing_s/step": 60.0}
    metrics["perf/max_memory_allocated_gb"] = 99.0  # a stale legacy key must not win
    summary = summarize([StepMetrics(1, metrics)], warmup_steps=0)
    assert summary.peak_mem_gib == pytest.approx(24.52155876159668)
    assert summary.reserved_mem_gib == pytest.approx(27.626953125)


def test_summarize_memory_peak_includes_warmup():
    steps = [
        StepMetrics(1, {"perf/throughput": 1.0, "timing_s/step": 2.0, "actor/perf/max_memory_allocated_gb": 70.0}),
        StepMetrics(2, {"perf/throughput": 3.0, "timing_s/step": 2.0, "actor/perf/max_memory_allocated_gb": 60.0}),
    ]
    summary = summarize(steps, warmup_steps=1)
    assert summary.tokens_per_s_per_gpu == 3.0
    assert summary.peak_mem_gib == 70.0
    assert summary.mfu_actor is None and summary.reserved_mem_gib is None


def test_summarize_ignores_nan_and_duplicate_steps():
    steps = [
        StepMetrics(1, {"perf/throughput": 100.0, "timing_s/step": 10.0}),
        StepMetrics(2, {"perf/throughput": math.nan, "timing_s/step": 10.0}),
        StepMetrics(3, {"perf/throughput": 300.0, "timing_s/step": 30.0}),
        StepMetrics(3, {"perf/throughput": 500.0, "timing_s/step": 50.0}),  # read twice: last wins
    ]
    summary = summarize(steps, warmup_steps=0)
    assert summary.timed_steps == 3
    assert summary.tokens_per_s_per_gpu == 300.0
    assert summary.step_s == 10.0


def test_summarize_without_timed_steps_raises():
    with pytest.raises(ValueError, match="no timed steps"):
        summarize(numpy2_run(), warmup_steps=2)
    with pytest.raises(ValueError, match="no timed steps"):
        summarize([parsed("issue_2060_v0.4.log")[0]], warmup_steps=0)


def test_summarize_rejects_bad_input():
    with pytest.raises(ValueError, match="warmup_steps"):
        summarize(numpy2_run(), warmup_steps=-1)
    with pytest.raises(ValueError, match="perf/throughput"):
        summarize(parsed("docs_quickstart_v0.1.log")[1:], warmup_steps=0)


def test_real_h200_jsonl_of_a_verl_probe_gives_its_score_and_phases():
    """The file logger's JSONL of autotune's first real verl probe (one H200, 2026-12-03): step 1 is warm-up,
    the score is step 2's perf/throughput, the phases are step 2's timing_s/*."""
    from autotune.verl.metrics import JsonlTail, summarize

    path = Path(__file__).parents[2] / "benchmarks" / "results" / "h200-2026-12-03-verl" / "trial0-metrics.jsonl"
    steps = JsonlTail(path).read_new()
    assert [s.step for s in steps] == [1, 2]
    summary = summarize(steps, warmup_steps=1)
    assert summary.tokens_per_s_per_gpu == pytest.approx(1868.855, abs=1e-3)
    assert summary.phase_s["gen"] == pytest.approx(10.103, abs=1e-3)
    assert summary.phase_s["update_actor"] == pytest.approx(17.671, abs=1e-3)
    assert summary.mfu_actor == pytest.approx(0.047, abs=1e-3)
    assert summary.peak_mem_gib == pytest.approx(28.818, abs=1e-3)


# ---- one rollout for every member of a shared launch (verl's 2-s replay-buffer poll) ----------------

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _real_steps(path: Path) -> list:
    from autotune.verl.metrics import StepMetrics

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [StepMetrics(step=r["step"], metrics=r["data"]) for r in rows]


def test_verl_times_gen_on_its_replay_buffers_poll_grid():
    """The source of REPLAY_POLL_S, read from the installed verl: the sync trainer's gen timer wraps the replay
    buffer's sample(), which sleeps poll_interval (2.0 s by default, not passed from the config) between checks."""
    pytest.importorskip("verl")
    import inspect

    from verl.trainer.ppo.v1 import replay_buffer, trainer_base

    from autotune.verl.metrics import REPLAY_POLL_S

    assert inspect.signature(replay_buffer.ReplayBuffer.__init__).parameters["poll_interval"].default == REPLAY_POLL_S
    assert "time.sleep(self.poll_interval)" in inspect.getsource(replay_buffer.ReplayBuffer._wait_for_next_poll)
    step_once = inspect.getsource(trainer_base.PPOTrainer._step_once)  # trainer/ppo/v1/trainer_base.py:562-574
    assert 'marked_timer("gen"' in step_once and "replay_buffer.sample(" in step_once
    assert "poll_interval" not in inspect.getsource(trainer_base)  # the trainer never sets it


def test_real_gen_times_sit_on_the_poll_grid():
    """Every timed step of the 2026-12-05 H200 launch: gen is 0.1-0.2 s above a multiple of 2 s."""
    steps = [s for s in _real_steps(RESULTS / "h200-2026-12-05-verl-shared/runs/trial0000/metrics.jsonl") if s.step >= 2]
    assert len(steps) == 17
    assert all(0.05 < s.metrics["timing_s/gen"] % 2.0 < 0.25 for s in steps)


def test_the_launchs_rollout_brings_the_shared_and_the_separate_launches_within_10_percent():
    """The exported best (trial 4, step 4) over the job (trial 0, steps 2 and 18) inside the 2026-12-05 launch, and
    the same two as separate launches on 2026-12-06 (benchmarks/launch_rollout_h200.py): 24% apart as verl logged
    them, 8% at one rollout; the job's own two steps in the launch, 18% apart, come within 10%."""
    import statistics

    from autotune.verl.metrics import launch_rollout, parse_console_line, with_launch_rollout

    steps = {s.step: s for s in _real_steps(RESULTS / "h200-2026-12-05-verl-shared/runs/trial0000/metrics.jsonl")}
    timed = [s for n, s in steps.items() if n >= 2]
    rollout = launch_rollout(timed)
    at = {n: with_launch_rollout(s.metrics, rollout) for n, s in steps.items() if n >= 2}
    raw = {n: s.metrics["perf/throughput"] for n, s in steps.items() if n >= 2}

    def spread(a, b):
        return abs(a - b) / ((a + b) / 2)

    assert spread(raw[2], raw[18]) > 0.18 and spread(at[2], at[18]) < 0.10

    def step2(name):
        merged = {}
        for line in (RESULTS / "h200-2026-12-06-fused" / name).read_text(errors="replace").splitlines():
            parsed = parse_console_line(line)
            if parsed is not None and parsed.step == 2:
                merged.update(parsed.metrics)
        return merged

    job, best = step2("rmpad_off.log"), step2("train_best.txt")
    pair = (statistics.median([job["timing_s/gen"], best["timing_s/gen"]]),
            statistics.median([job["perf/total_num_tokens"], best["perf/total_num_tokens"]]))
    inside_raw = raw[4] / statistics.mean([raw[2], raw[18]])
    separate_raw = best["perf/throughput"] / job["perf/throughput"]
    inside = at[4] / statistics.mean([at[2], at[18]])
    separate = with_launch_rollout(best, pair) / with_launch_rollout(job, pair)
    assert inside_raw / separate_raw > 1.2
    assert abs(inside / separate - 1) < 0.10
