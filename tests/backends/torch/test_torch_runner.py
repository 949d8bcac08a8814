"""How the torch backend reads a probe's end (no torch needed): exit codes, signals and log lines."""

import signal

import pytest

from autotune.errors import ProbeCrashed, ProbeEnvironmentError
from autotune.backends.process import ProcessOutcome
from autotune.backends.torch.runner import _outcome_to_result

# liger-kernel 0.8.5 logs these on import when optional backends are absent (seen on the H200, 2026-12-02)
LIGER_WARNING = ("Backend impl 'liger_kernel.ops.backends._ascend.rope' for op 'rope' could not be imported: "
                 "ImportError: cannot import name 'tanh' from 'triton.language.math'")


def _outcome(tmp_path, returncode: int, log: str) -> ProcessOutcome:
    log_path = tmp_path / "probe.log"
    log_path.write_text(log)
    return ProcessOutcome(returncode=returncode, timed_out=False, hung=False, interrupted=False, wall_s=12.0,
                          log_path=log_path)


def test_a_missing_module_is_an_environment_error(tmp_path):
    log = "Traceback (most recent call last):\n  File \"x.py\", line 1\nModuleNotFoundError: No module named 'peft'\n"
    with pytest.raises(ProbeEnvironmentError, match="No module named 'peft'"):
        _outcome_to_result(_outcome(tmp_path, 1, log), tmp_path)


def test_a_warning_that_mentions_import_error_is_not_an_environment_error(tmp_path):
    """A crash whose log ends with a library's warning stays a crash of this candidate, and the study goes on."""
    with pytest.raises(ProbeCrashed, match="exited with code 1"):
        _outcome_to_result(_outcome(tmp_path, 1, f"{LIGER_WARNING}\n"), tmp_path)


def test_a_probe_killed_by_a_signal_says_which(tmp_path):
    with pytest.raises(ProbeCrashed, match="killed by SIGKILL \\(the host may have run out of memory\\)"):
        _outcome_to_result(_outcome(tmp_path, -signal.SIGKILL, f"{LIGER_WARNING}\n"), tmp_path)
