"""Ctrl-C, SIGTERM and SIGHUP stop the tuner: at once before the study loop, at a safe point inside it.

Until the CLI has loaded, `autotune.stop_at_once()` ends the process in one line (from the package's first lines
when the installed command starts; from autotune/__main__.py under `python -m autotune`).

A scheduler's SIGTERM (`timeout`, Slurm, Kubernetes) must stop the run whatever it is doing:
validating, ranking the warm start, waiting out a database. So outside the study loop the handler
raises KeyboardInterrupt where the main thread is.

Inside the study loop (`deferred()`), a signal only requests the stop; `check()` raises it at the next
safe point (each probe step, each poll of a probe process, each storage back-off, each new trial).
Raising wherever the main thread happens to be left trials RUNNING under load (issue 20, about 1 run
in 10): it landed inside SQLAlchemy, whose half-done transaction kept SQLite locked so that marking
the trial failed could not be written; or inside a weakref callback, where Python only prints
"Exception ignored" and carries on.

Four more rules keep the clean-up whole:
- Storage calls and a trial's bookkeeping (between Optuna creating a trial and recording who runs it;
  marking an interrupted trial failed) run under `critical()`: a signal that arrives there is held and
  raised when the section ends (outside the loop), and `check()` does not raise inside one.
- Only the first signal of a stop raises. A second one (an impatient Ctrl-C) is counted, not raised:
  raised inside the except block that records the interrupted trial, it left that trial RUNNING.
  `hurried()` tells a probe's kill to skip its grace period instead.
- A wait that is only patience (a locked database's back-off) ends on a stop request inside a critical section
  too (`patient_sleep`): the call that failed changed nothing, and SQLite's lock may outlast any patience.
- SIGHUP (the terminal closed) is handled like SIGTERM (Python's default would end the process with
  no clean-up at all: https://docs.python.org/3/library/signal.html).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_requested = threading.Event()
_received = 0  # signals since the last reset; 2 or more: the user is in a hurry
_depth = 0  # nesting of critical() in the main thread
_deferred = 0  # nesting of deferred() in the main thread
_held: int | None = None  # a signal that arrived inside a critical section, to raise when it ends


def _handler(signum, frame) -> None:
    global _held, _received
    _received += 1
    if _requested.is_set():
        return  # a stop is under way: raising again would cut its clean-up short
    _requested.set()
    if _deferred > 0:
        return  # the study loop raises it at its next check()
    if _depth > 0:
        _held = signum
        return
    raise KeyboardInterrupt(f"signal {signum}")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP to the handler (main thread only, as Python requires)."""
    if not _main_thread():
        return
    for sig in _SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup` ignores SIGHUP on purpose: keep it so
            signal.signal(sig, _handler)


def ignore_further() -> None:
    """The run is stopping: further signals have nothing left to interrupt."""
    if _main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextmanager
def critical() -> Iterator[None]:
    """Hold signals until the block ends, then raise KeyboardInterrupt if one came (not inside deferred())."""
    global _depth, _held
    main = _main_thread()
    if main:
        _depth += 1
    try:
        yield
    finally:
        if main:
            _depth -= 1
            if _depth == 0 and _held is not None:
                signum, _held = _held, None
                raise KeyboardInterrupt(f"signal {signum} (held until the trial was recorded)")


@contextmanager
def deferred() -> Iterator[None]:
    """Inside: a signal only requests the stop, and `check()` raises it (the study loop)."""
    global _deferred
    main = _main_thread()
    if main:
        _deferred += 1
    try:
        yield
    finally:
        if main:
            _deferred -= 1


def requested() -> bool:
    return _requested.is_set()


def hurried() -> bool:
    """A second signal came while stopping: skip waits that are only politeness (a probe's kill grace)."""
    return _received >= 2


def check() -> None:
    """Raise KeyboardInterrupt here if a stop was requested (for loops that must not run on after it); in the
    main thread not inside a critical section, whose clean-up must finish (it raises when it ends)."""
    if _requested.is_set() and not (_depth > 0 and _main_thread()):
        raise KeyboardInterrupt("stop requested")


STOP_POLL_S = 0.1  # how soon a wait notices a stop request


def patient_sleep(seconds: float) -> None:
    """Sleep `seconds`, but raise KeyboardInterrupt within STOP_POLL_S of a stop request, inside a critical section
    too: for waits that are only patience (a locked database's back-off), which change nothing stored. A plain
    time.sleep resumes after a handler that only requests the stop (inside the study loop) and waited it out."""
    end_s = time.monotonic() + seconds
    while True:
        if _requested.is_set():
            raise KeyboardInterrupt("stop requested while waiting")
        left_s = end_s - time.monotonic()
        if left_s <= 0:
            return
        time.sleep(min(left_s, STOP_POLL_S))


def reset() -> None:
    """The stop was handled: forget it, including CPython's own note of it (below)."""
    global _held, _received
    _requested.clear()
    _held = None
    _received = 0
    _forget_cpython_unhandled_flag()


def _forget_cpython_unhandled_flag() -> None:
    """A KeyboardInterrupt raised inside a string `exec` (dataclasses builds every __init__ that way, so a
    signal while importing lands there about 1 time in 20) sets CPython's
    `_PyRuntime.signals.unhandled_keyboard_interrupt` even though we catch it; under `python -m` the
    interpreter then ends itself with SIGINT (exit -2) instead of our 130 (Python/pythonrun.c
    run_eval_code_obj, Modules/main.c Py_RunMain). The next string eval clears the flag at its start."""
    eval("None")
