"""Ctrl-C, SIGTERM and SIGHUP stop the tuner at once, except inside short critical sections.

A scheduler's SIGTERM (`timeout`, Slurm, Kubernetes) must stop the run whatever it is doing:
validating, ranking the warm start, waiting out a database. So the handler raises KeyboardInterrupt
where the main thread is. The exception is a trial's bookkeeping: between Optuna creating a trial
and recording who runs it, and while an interrupted trial is marked failed, an exception would leave
a RUNNING trial behind (a double Ctrl-C did, once in 5). Those sections run under `critical()`: any
signal that arrives there, a second one included, is held and raised when the section ends.
SIGHUP (the terminal closed) is handled like SIGTERM (Python's default would end the process with no
clean-up at all: https://docs.python.org/3/library/signal.html).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_requested = threading.Event()
_depth = 0  # nesting of critical() in the main thread
_held: int | None = None  # a signal that arrived inside a critical section


def _handler(signum, frame) -> None:
    global _held
    _requested.set()
    if _depth > 0:
        _held = signum
        return
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP to the handler (main thread only, as Python requires)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup` ignores SIGHUP on purpose: keep it so
            signal.signal(sig, _handler)


def ignore_further() -> None:
    """The run is stopping: further signals have nothing left to interrupt."""
    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def restore_defaults() -> None:
    """Python's own handling (KeyboardInterrupt on Ctrl-C; SIGTERM and SIGHUP end the process)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                         (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, default)


@contextmanager
def critical() -> Iterator[None]:
    """Hold signals until the block ends, then raise KeyboardInterrupt if one came."""
    global _depth, _held
    main = threading.current_thread() is threading.main_thread()
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


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt here if a stop was requested (for loops that must not run on after it)."""
    if _requested.is_set():
        raise KeyboardInterrupt("stop requested")


def reset() -> None:
    global _held
    _requested.clear()
    _held = None
