"""autotune: find the fastest way to run a verl GRPO training job.

Public API (small on purpose): the CLI (`autotune.cli.main`), the model and GPU tables, and the pieces a
script may compose: SearchSpace, check (verl's rules), estimate_memory / estimate_step_time (the
calibrated model) and run_study. Heavy backends (torch, verl) import lazily.
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"

# the line a stopped command ends with (cli.main prints it too, once the CLI has loaded)
INTERRUPTED_LINE = "autotune: interrupted"
RESUME_NOTE = "; finished trials are stored, run the same command to resume"
STOPPED_AT_ONCE = f"{INTERRUPTED_LINE}{RESUME_NOTE}\n".encode()


def stop_at_once() -> None:
    """Until interrupt.install(): a signal ends the process at once in one line with 130. For the start, while the
    CLI loads (a second or two) and nothing is stored yet: a KeyboardInterrupt there printed a traceback, SIGTERM
    ended it with -15 and SIGHUP with -1 (issue 33). Here, in the package's first module, so that the installed
    command has it before importing anything more (the import of interrupt.py itself was a window)."""
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) is not _signal.SIG_IGN:  # `nohup` and background jobs ignore some on purpose
            _signal.signal(sig, _exit_at_once)


def _exit_at_once(signum, frame) -> None:
    _os.write(2, STOPPED_AT_ONCE)
    _os._exit(130)


# The installed command is starting (pip's script imports this package first): from here on a signal is one line and
# 130, never a traceback. Imported as a library, nothing is installed.
if _sys.argv and _sys.argv[0].rsplit("/", 1)[-1] == "autotune":
    stop_at_once()
