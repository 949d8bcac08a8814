"""Failure classification on real verl log excerpts (tests/verl/data/verl_failures).

Each corpus file is `<expected_kind>__<slug>.log`, starting with `# source: <url>` and
`# expected_phase: <phase or none>`; further `# note:` lines explain the excerpt.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from autotune.verl.failures import (
    MAX_MESSAGE_CHARS,
    Failure,
    FailureKind,
    classify_failure,
)
from autotune.verl.metrics import parse_console_line

CORPUS = sorted((Path(__file__).parent / "data" / "verl_failures").glob("*.log"))
EVIDENCE_KINDS = {
    FailureKind.CUDA_OOM,
    FailureKind.KV_CACHE_TOO_SMALL,
    FailureKind.HOST_OOM,
    FailureKind.NCCL,
    FailureKind.CONFIG_REJECTED,
    FailureKind.ENVIRONMENT,
}


def load(path: Path) -> tuple[dict[str, str], str]:
    """(header fields, excerpt) of a corpus file; the header is its leading `#` lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header_len = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    fields = dict(line[2:].split(": ", 1) for line in lines[:header_len] if ": " in line)
    return fields, "\n".join(lines[header_len:])


def excerpt(name: str) -> str:
    return load(next(p for p in CORPUS if p.name == name))[1]


def test_corpus_is_real_and_covers_the_evidence_kinds():
    assert len(CORPUS) >= 16
    kinds = set()
    for path in CORPUS:
        fields, text = load(path)
        # a public thread, or a real probe of ours kept with its full log
        assert fields["source"].startswith(("https://github.com/", "benchmarks/results/")), path.name
        if fields["source"].startswith("benchmarks/results/"):
            assert (Path(__file__).parents[2] / fields["source"].split(" ")[0]).is_file(), path.name
        assert "expected_phase" in fields and text.strip(), path.name
        kinds.add(FailureKind(path.name.split("__", 1)[0]))
    assert EVIDENCE_KINDS | {FailureKind.UNKNOWN} <= kinds


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_corpus_kind_and_phase(path):
    fields, text = load(path)
    failure = classify_failure(1, text)
    assert failure.kind is FailureKind(path.name.split("__", 1)[0])
    expected_phase = None if fields["expected_phase"] == "none" else fields["expected_phase"]
    assert failure.phase == expected_phase
    assert 0 < len(failure.message) <= MAX_MESSAGE_CHARS and "\n" not in failure.message
    if failure.kind in EVIDENCE_KINDS:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colours worker prefixes; the message is plain text
        assert " ".join(failure.message.split()[:4]) in " ".join(plain.split())  # the evidence line


def test_requested_gib_from_a_real_oom():
    failure = classify_failure(1, excerpt("cuda_oom__one_step_off_compute_log_prob.log"))
    assert failure.requested_gib == pytest.approx(13.91)
    assert failure.is_gpu_memory


@pytest.mark.parametrize(
    ("line", "gib"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0", 2.5),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 388.00 MiB. GPU 0", 388 / 1024),
    ],
)
def test_requested_gib_units(line, gib):
    assert classify_failure(1, line).requested_gib == pytest.approx(gib)


def test_oom_under_a_ray_task_error_wrapper_is_an_oom():
    tail = "\n".join(
        [
            excerpt("cuda_oom__one_step_off_compute_log_prob.log"),
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_compute_log_prob()",
        ]
    )
    failure = classify_failure(1, tail)
    assert failure.kind is FailureKind.CUDA_OOM
    assert failure.phase == "old_log_prob"


def test_nccl_timeout_after_an_oom_on_another_rank_is_the_oom():
    # A rank dies of OOM; the others sit in a collective until the NCCL watchdog fires.
    tail = excerpt("cuda_oom__one_step_off_compute_log_prob.log") + "\n" + excerpt("nccl__sft_alltoall_watchdog.log")
    assert classify_failure(1, tail).kind is FailureKind.CUDA_OOM
    assert classify_failure(1, excerpt("nccl__sft_alltoall_watchdog.log")).kind is FailureKind.NCCL


def test_evidence_outranks_the_hang_flag():
    oom = classify_failure(-15, excerpt("cuda_oom__vllm_wake_up_cumem.log"), hung=True)
    assert oom.kind is FailureKind.CUDA_OOM and oom.phase == "rollout"


def test_hang_without_evidence():
    tail = "\n".join(log_lines_of_step_run()) + "\n(TaskRunner pid=1) Training Progress:  50%"
    failure = classify_failure(-15, tail, hung=True)
    assert failure.kind is FailureKind.HANG
    assert "Training Progress" in failure.message
    assert not failure.is_gpu_memory


def log_lines_of_step_run() -> list[str]:
    data = Path(__file__).parent / "data" / "verl_logs" / "notes_numpy2_v0.5.log"
    return [line for line in data.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]


def test_step_lines_are_not_failure_evidence():
    # metric names such as perf/max_memory_allocated_gb or timing_s/update_actor must not match
    lines = log_lines_of_step_run()
    assert all(parse_console_line(line) is not None for line in lines)
    failure = classify_failure(1, "\n".join(lines))
    assert failure.kind is FailureKind.UNKNOWN
    assert failure.phase == "update_actor"  # timing_s/update_actor is the last marker


def test_interrupted_wins():
    failure = classify_failure(-2, excerpt("host_oom__taskrunner_run.log"), interrupted=True)
    assert failure.kind is FailureKind.INTERRUPTED


@pytest.mark.parametrize("code", [-9, 137])
def test_bare_sigkill_is_unknown_not_host_oom(code):
    failure = classify_failure(code, "(TaskRunner pid=1) step:3 - perf/throughput:1000.0\n")
    assert failure.kind is FailureKind.UNKNOWN
    assert "SIGKILL" in failure.message


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # verl.md section 2 messages (verl/utils/config.py, workers/config/actor.py, seqlen_balancing.py)
        (
            "AssertionError: real_train_batch_size (96) must be divisible by minimal possible batch size (64)",
            FailureKind.CONFIG_REJECTED,
        ),
        (
            "ValueError: [actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
            "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.",
            FailureKind.CONFIG_REJECTED,
        ),
        ("AssertionError: train_batch_size (8) must be >= actor.ppo_mini_batch_size (16)", FailureKind.CONFIG_REJECTED),
        (
            "hydra.errors.ConfigCompositionException: "
            "Could not override 'actor_rollout_ref.actor.megatron.grad_offload'.",
            FailureKind.CONFIG_REJECTED,
        ),
        # vLLM KV-cache checks (vllm kv_cache_utils.py / gpu_worker.py)
        (
            "ValueError: To serve at least one request with the models's max seq len (131072), (4.54 GiB KV cache "
            "is needed, which is larger than the available KV cache memory (1.71 GiB).",
            FailureKind.KV_CACHE_TOO_SMALL,
        ),
        (
            "ValueError: Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 19.84 GiB).",
            FailureKind.KV_CACHE_TOO_SMALL,
        ),
        ("RuntimeError: CUDA error: out of memory", FailureKind.CUDA_OOM),
        ("RuntimeError: DataLoader worker (pid 123) is killed by signal: Killed.", FailureKind.HOST_OOM),
        ("RuntimeError: No CUDA GPUs are available", FailureKind.ENVIRONMENT),
        ("RuntimeError: CUDA driver version is insufficient for CUDA runtime version", FailureKind.ENVIRONMENT),
        ("ConnectionError: Could not find any running Ray instance. Please specify the one", FailureKind.ENVIRONMENT),
        ("RuntimeError: NCCL Error 2: unhandled system error", FailureKind.NCCL),
        ("ncclInternalError: Internal check failed.", FailureKind.NCCL),
    ],
)
def test_message_kinds(text, kind):
    assert classify_failure(1, text).kind is kind


def test_missing_module_warning_is_not_the_failure():
    # vLLM prints this at import time on healthy runs (seen in verl CI logs).
    tail = (
        "(pid=295552) /usr/local/lib/python3.11/dist-packages/vllm/connections.py:8: "
        "RuntimeWarning: Failed to read commit hash:\n"
        "(pid=295552) WARNING No module named 'vllm._version'\n"
        "The actor is dead because its worker process has died."
    )
    assert classify_failure(1, tail).kind is FailureKind.UNKNOWN


@pytest.mark.parametrize(
    ("tail", "phase"),
    [
        ("ray::WorkerDict.actor_rollout_compute_ref_log_prob()", "ref"),
        ("ray::WorkerDict.actor_rollout_update_actor()", "update_actor"),
        ("  File \"verl/workers/engine_workers.py\", line 270, in train_batch", "update_actor"),
        ("  File \"verl/workers/actor/dp_actor.py\", line 400, in update_policy", "update_actor"),
        ("ray::WorkerDict.actor_rollout_init_model()", "init"),
        ("(vLLMHttpServer pid=9) ERROR [core.py:708] EngineCore failed to start", "rollout"),
        ("Error executing job with overrides: ['actor_rollout_ref.rollout.name=vllm']", None),
        ("", None),
    ],
)
def test_phase_markers(tail, phase):
    assert classify_failure(1, tail).phase == phase


def test_message_is_one_trimmed_line():
    failure = classify_failure(1, "torch.OutOfMemoryError: CUDA out of memory. " + "x " * 400)
    assert len(failure.message) == MAX_MESSAGE_CHARS and failure.message.endswith("...")


def test_failure_is_frozen_and_gpu_memory_flag():
    failure = Failure(FailureKind.KV_CACHE_TOO_SMALL, "rollout", "m")
    assert failure.is_gpu_memory
    assert not Failure(FailureKind.HOST_OOM, None, "m").is_gpu_memory
    with pytest.raises(AttributeError):
        failure.kind = FailureKind.UNKNOWN  # type: ignore[misc]
    assert FailureKind("cuda_oom") is FailureKind.CUDA_OOM and FailureKind.CUDA_OOM == "cuda_oom"


@pytest.mark.parametrize(
    "text",
    [
        "step:1 - k:" + "1" * 200_000 + "x",
        "step:1 - k:1" + " " * 200_000 + "x",
        "a." * 100_000,
        "[repeated " * 30_000,
        "step:1 - " * 30_000,
        "Free memory on device " * 20_000,
        "\n" * 200_000,
    ],
    ids=["digits", "spaces", "dotted", "ray-repeat", "items", "vllm-free", "newlines"],
)
def test_linear_time_on_pathological_text(text):
    # a child can print anything; a backtracking regex must not stall the tuner on one line
    started_s = time.perf_counter()
    parse_console_line(text)
    classify_failure(1, text)
    assert time.perf_counter() - started_s < 2.0


# ---------------------------------------------------------------------------------------------
# Fuzz: neither parser may raise on any text a child process can print
# ---------------------------------------------------------------------------------------------

try:
    import hypothesis
    from hypothesis import strategies as st
except ImportError:  # hypothesis is a test extra; only the fuzz tests need it
    hypothesis = None


if hypothesis is None:

    def test_fuzz_needs_hypothesis():
        pytest.importorskip("hypothesis")

else:
    NEAR_MISSES = ["step:", " - ", ":np.float64(", "Tried to allocate ", "\x1b[36m", "(TaskRunner pid=1) "]
    _REAL_LINES = [line for p in CORPUS for line in load(p)[1].splitlines()] + log_lines_of_step_run()

    @st.composite
    def log_like_text(draw):
        """Random text spliced with pieces of real verl lines, so the regexes meet near-misses."""
        pieces = draw(
            st.lists(
                st.one_of(
                    st.text(max_size=200),
                    st.sampled_from(_REAL_LINES).map(lambda line: line[: len(line) // 2]),
                    st.sampled_from(NEAR_MISSES),
                ),
                max_size=12,
            )
        )
        return "".join(pieces)

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(text=log_like_text(), code=st.one_of(st.none(), st.integers(-300, 300)), hung=st.booleans())
    def test_classify_failure_never_raises(text, code, hung):
        failure = classify_failure(code, text, hung=hung)
        assert isinstance(failure.kind, FailureKind)
        assert len(failure.message) <= MAX_MESSAGE_CHARS

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(text=st.one_of(st.text(), log_like_text()))
    def test_parse_console_line_never_raises(text):
        step = parse_console_line(text)
        assert step is None or (step.step >= 0 and all(isinstance(v, float) for v in step.metrics.values()))
