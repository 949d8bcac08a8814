"""Exception hierarchy: what went wrong, in words a user can act on.

`AutotuneError` and its subclasses carry a one-line message; the CLI prints it and exits 2
(bad input) or 1 (a run that failed), never a traceback.
"""

from __future__ import annotations

import functools


class AutotuneError(Exception):
    """Base class: the message is shown to the user as one line."""

    exit_code = 1


class ConfigError(AutotuneError):
    """Bad input: an unknown name, a value out of range, a broken tune.yaml, an unusable URL."""

    exit_code = 2


class LaunchScriptError(ConfigError):
    """A launch script or config given to --from cannot be imported at all (one line, naming the file)."""


class BackendUnavailable(AutotuneError):
    """The chosen probe backend cannot run here (missing extra, no GPU, not implemented)."""

    exit_code = 2


class StorageError(AutotuneError):
    """The study database cannot be opened or written."""

    exit_code = 2


class StorageUnavailable(AutotuneError):
    """The study database stopped answering during a run (locked, restarting, unreachable) past the retries."""


class RunFolderError(AutotuneError):
    """The run folder cannot be written (disk full, read-only): nothing can be probed."""


class ProbeError(AutotuneError):
    """A probe did not produce a measurement."""

    probe_wall_s: float | None = None  # the GPU time it spent before it failed (set by the backend that knows)


class ProbeOOM(ProbeError):
    """The probe ran out of GPU memory: a property of the candidate, taught to the sampler.

    `over_gib` grades the violation for the sampler (how far past capacity, or the size of the
    failed allocation when that is all the log says); `phase` names the GRPO phase that failed.
    """

    def __init__(self, message: str, *, phase: str | None = None, over_gib: float | None = None,
                 peak_mem_gib: float | None = None, kind: str = "cuda_oom") -> None:
        super().__init__(message)
        self.kind = kind  # cuda_oom | kv_cache_too_small (vLLM found no room for one sequence's KV cache)
        self.phase = phase
        self.over_gib = over_gib
        self.peak_mem_gib = peak_mem_gib


class ProbeRejected(ProbeError):
    """verl refused the configuration at start-up: a rule autotune's pre-checks did not know; taught to the
    sampler like a rule violation."""


class ProbeTimeout(ProbeError):
    """The probe exceeded its deadline or stopped making progress."""


class ProbeCrashed(ProbeError):
    """The probe died for a reason that is not the candidate's memory use."""


class ProbeEnvironmentError(ProbeError):
    """The probe cannot run on this machine at all (missing package, no GPU, bad path): stop the study."""

    exit_code = 2


@functools.cache  # read once: select.py and the torch runner build their hints at import
def install_hint(extra: str) -> str:
    """The `pip install` of an optional extra that works where this autotune runs: from a source checkout (its
    pyproject.toml beside the package, as in an editable install) the checkout's folder, since the PyPI name
    installs the published release, not this code."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    try:
        source = 'name = "verl-autotune"' in (root / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        source = False
    return f"pip install '{root}[{extra}]'" if source else f"pip install 'verl-autotune[{extra}]'"
