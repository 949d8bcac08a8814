"""`python -m autotune` and the installed `autotune` command (pyproject: `autotune.__main__:entry`).

A signal is handled from the first line of autotune that runs (issue 33): loading the CLI takes a second or two,
and with the entry point at `autotune.cli:main` a signal then gave a KeyboardInterrupt traceback (SIGINT) or ended
the process with no word (SIGTERM -15, SIGHUP -1). The installed command already stops at once from the package's
first lines (autotune/__init__.py); `python -m autotune` from here. Only the interpreter's own start is out of reach.
"""

import sys

import autotune


def entry() -> int:
    """The console script: stop at once until the CLI replaces the handlers with interrupt.install()'s."""
    autotune.stop_at_once()
    from autotune.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(entry())
