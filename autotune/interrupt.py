"""Ctrl-C and SIGTERM as a request to stop, honoured at safe points.

Python raises KeyboardInterrupt wherever the main thread happens to be, which can be inside Optuna's
storage calls between creating a trial and recording who runs it, leaving a RUNNING trial behind. The
handlers here only record the request; the study loop, the probe watchdog and the step reports raise
KeyboardInterrupt where the trial can be recorded as interrupted. A second signal raises at once.
"""

from __future__ import annotations

import signal
import threading

_requested = threading.Event()


def _handler(signum, frame) -> None:
    if _requested.is_set():
        raise KeyboardInterrupt(f"signal {signum} (second)")
    _requested.set()


def install() -> None:
    """Route SIGINT and SIGTERM to a stop request (main thread only, as Python requires)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt here if a stop was requested."""
    if _requested.is_set():
        raise KeyboardInterrupt("stop requested")


def reset() -> None:
    _requested.clear()
