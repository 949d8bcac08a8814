"""`python -m autotune` and the installed `autotune` command (pyproject: `autotune.__main__:entry`).

Both start here, so that a signal is handled from the first line of autotune that runs: loading the CLI takes a
second or two, and with the entry point at `autotune.cli:main` a signal then gave a KeyboardInterrupt traceback
(SIGINT) or ended the process with no word (SIGTERM -15, SIGHUP -1) (issue 33). Only the interpreter's own start,
before any of this, is out of reach.
"""

import os
import signal
import sys


def _stop_early(signum, frame) -> None:  # before the CLI is loaded nothing is stored: stop now, in one line
    os.write(2, b"autotune: interrupted; finished trials are stored, run the same command to resume\n")
    os._exit(130)


def _handle_signals_at_once() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup` and background jobs ignore some on purpose
            signal.signal(sig, _stop_early)


def entry() -> int:
    """The console script: handlers first, then the CLI (cli.main replaces them with interrupt.py's)."""
    _handle_signals_at_once()
    from autotune.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(entry())
