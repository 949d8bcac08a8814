"""Run one probe as its own process group and leave nothing of it behind.

`python3 -m verl.trainer.main_ppo` starts a local Ray cluster, Ray workers and vLLM engine
processes; killing only the driver leaves them holding GPUs. reference/verl.md section 4
("Recommended capture") says: own process group (setsid), wall-clock limit, kill the group.
Output is read in the caller's thread, so `on_output` and `should_stop` run there and anything
they raise (KeyboardInterrupt included) reaches the caller after the group is dead.
"""

from __future__ import annotations

import enum
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from autotune import interrupt

__all__ = ["ProcessOutcome", "end_recorded_probe", "group_alive", "kill_process_group", "run_in_process_group"]

# Every probe process carries this variable (children inherit it); the value, recorded in the pgid file
# before the probe starts, is how a later run tells the probe's processes from whatever reuses its ids.
TOKEN_ENV = "AUTOTUNE_PROBE_TOKEN"

_POLL_S = 0.1  # how often the watchdog looks at the clocks while the child is quiet
_GONE_POLL_S = 0.05
_SIGKILL_WAIT_S = 5.0  # SIGKILL cannot be caught; this only covers processes stuck in the kernel
_DRAIN_S = 2.0  # reading what is left in the pipe once the group is dead
_READ_BYTES = 65536
_MAX_LINE_BYTES = 1 << 20  # a progress bar that never prints "\n" is cut into 1 MiB lines
# The child died of a signal nobody here sent: a scheduler's SIGTERM, an operator's Ctrl-C.
# (-N is Popen's "killed by signal N"; 128+N is what a wrapping shell reports.)
_INTERRUPT_CODES = frozenset({-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP, 130, 143, 129})


@dataclass(frozen=True)
class ProcessOutcome:
    """How a probe process ended; `returncode` is negative when a signal ended it."""

    returncode: int | None
    timed_out: bool
    hung: bool
    interrupted: bool
    wall_s: float
    log_path: Path


class _Stop(enum.Enum):
    EXITED = "exited"
    TIMED_OUT = "timed_out"
    HUNG = "hung"
    STOPPED = "stopped"


def run_in_process_group(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    deadline_s: float,
    idle_timeout_s: float,
    on_output: Callable[[str], bool] | None = None,
    should_stop: Callable[[], bool] | None = None,
    kill_grace_s: float = 10.0,
    pgid_file: Path | None = None,
) -> ProcessOutcome:
    """Run `argv` in a new session, tee its output, and kill the whole group on any way out.

    `pgid_file` records the probe's identity while it lives, so that a tuner restarted after being
    killed itself (SIGKILL runs no finally block) can end a probe group it left behind: a random token,
    written before the process exists and put in its environment, then the group id. A kill -9 between
    fork and the second write still leaves the token (end_recorded_probe finds the processes by it).

    `on_output(line)` returns True when the line shows progress (a new step); without it every
    line counts. The group is killed after `idle_timeout_s` without progress (hung), after
    `deadline_s` in all (timed_out), or when `should_stop()` says so; after a normal exit any
    leftover member is killed too.
    """
    _check_args(argv, deadline_s, idle_timeout_s, kill_grace_s)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started_s = time.monotonic()
    if pgid_file is not None:
        token = os.urandom(16).hex()
        env = {**env, TOKEN_ENV: token}
        _write_record(Path(pgid_file), {"token": token})
    with log_path.open("w", encoding="utf-8", errors="replace", buffering=1) as log:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            if pgid_file is not None:
                _write_record(Path(pgid_file), {"token": token, "pgid": proc.pid})
            tee = _Tee(log, on_output)
            stop = _watch(proc, tee, started_s, deadline_s, idle_timeout_s, should_stop)
            _bury(proc, kill_grace_s)
            tee.drain(proc)
        finally:
            _bury(proc, kill_grace_s)
            if proc.stdout is not None:
                proc.stdout.close()
            if pgid_file is not None:
                Path(pgid_file).unlink(missing_ok=True)
    return ProcessOutcome(
        returncode=proc.returncode,
        timed_out=stop is _Stop.TIMED_OUT,
        hung=stop is _Stop.HUNG,
        interrupted=stop is _Stop.EXITED and proc.returncode in _INTERRUPT_CODES,
        wall_s=time.monotonic() - started_s,
        log_path=log_path,
    )


def _write_record(path: Path, record: dict) -> None:
    """Atomically (write, then rename): a reader sees the old record or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def end_recorded_probe(pgid_file: Path, grace_s: float = 10.0) -> bool:
    """End the probe recorded in `pgid_file` if any of its processes still runs; True if one did.

    Only processes whose environment holds the recorded token are signalled (their groups killed):
    a group id alone is not trusted, since the number may belong to another job by now (PID reuse).
    A file without a token (written by an older autotune) is not acted on.
    """
    try:
        record = json.loads(Path(pgid_file).read_text())
    except (OSError, ValueError):
        return False
    token = record.get("token") if isinstance(record, dict) else None
    if not isinstance(token, str) or not token:
        Path(pgid_file).unlink(missing_ok=True)
        return False
    groups = processes_with_token(token)
    for pgid in groups:
        kill_process_group(pgid, grace_s)
    Path(pgid_file).unlink(missing_ok=True)
    return bool(groups)


def processes_with_token(token: str) -> set[int]:
    """Process groups of the live processes whose environment has TOKEN_ENV=token (Linux /proc)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    groups: set[int] = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return groups
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            if needle in environ:
                pgid = os.getpgid(int(pid))
                if _live_in_group(pid, pgid):
                    groups.add(pgid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return groups


def kill_process_group(pgid: int, grace_s: float) -> bool:
    """SIGTERM the group, wait `grace_s`, then SIGKILL it; True once no live member is left.

    Zombies count as gone: they hold no memory or GPU, and their parent (for the leader, the
    Popen that started it) reaps them.
    """
    if not _group_alive(pgid):
        return True
    _signal_group(pgid, signal.SIGTERM)
    if _wait_group_gone(pgid, grace_s, give_up=interrupt.hurried):  # a second Ctrl-C skips the grace
        return True
    _signal_group(pgid, signal.SIGKILL)
    return _wait_group_gone(pgid, _SIGKILL_WAIT_S)


def _check_args(argv: list[str], deadline_s: float, idle_timeout_s: float, kill_grace_s: float) -> None:
    if not argv:
        raise ValueError(f"argv must name a program, but got {argv=}")
    if deadline_s <= 0:
        raise ValueError(f"deadline_s must be > 0, but got {deadline_s=}")
    if idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s must be > 0, but got {idle_timeout_s=}")
    if kill_grace_s < 0:
        raise ValueError(f"kill_grace_s must be >= 0, but got {kill_grace_s=}")


class _Tee:
    """Splits the child's bytes into lines, writes each to the log and hands it to `on_output`."""

    def __init__(self, log: TextIO, on_output: Callable[[str], bool] | None) -> None:
        self._log = log
        self._on_output = on_output
        self._pending = b""

    def feed(self, chunk: bytes) -> bool:
        """Handle the complete lines in `chunk`; True if any of them showed progress."""
        data = self._pending + chunk
        parts = data.split(b"\n")
        self._pending = parts.pop()
        lines = [part + b"\n" for part in parts]
        if len(self._pending) >= _MAX_LINE_BYTES:
            lines.append(self._pending + b"\n")
            self._pending = b""
        progress = [self._emit(line) for line in lines]
        return any(progress)

    def finish(self) -> None:
        """The last line, if the child ended without a newline."""
        if self._pending:
            self._emit(self._pending + b"\n")
            self._pending = b""

    def drain(self, proc: subprocess.Popen[bytes]) -> None:
        """Read what is left in the pipe after the group is dead (bounded: a setsid escapee keeps it open)."""
        if proc.stdout is None or proc.stdout.closed:
            return
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout.fileno(), selectors.EVENT_READ)
            end_s = time.monotonic() + _DRAIN_S
            while time.monotonic() < end_s and sel.select(timeout=_POLL_S):
                chunk = os.read(proc.stdout.fileno(), _READ_BYTES)
                if not chunk:
                    break
                self.feed(chunk)
        self.finish()

    def _emit(self, raw: bytes) -> bool:
        text = raw.decode("utf-8", errors="replace")
        self._log.write(text)
        if self._on_output is None:
            return True
        return bool(self._on_output(text.rstrip("\r\n")))


def _watch(
    proc: subprocess.Popen[bytes],
    tee: _Tee,
    started_s: float,
    deadline_s: float,
    idle_timeout_s: float,
    should_stop: Callable[[], bool] | None,
) -> _Stop:
    """Pump output until the child exits or a limit says stop; returns why."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    last_progress_s = started_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            interrupt.check()  # Ctrl-C / SIGTERM: the caller's finally kills the group
            if _read_available(sel, fd, tee):
                last_progress_s = time.monotonic()
            stop = _why_stop(proc, started_s, last_progress_s, deadline_s, idle_timeout_s, should_stop)
            if stop is not None:
                return stop


def _read_available(sel: selectors.BaseSelector, fd: int, tee: _Tee) -> bool:
    """Wait up to _POLL_S for output and feed it; True if a line showed progress."""
    if not sel.get_map():  # the child closed its output but is still running
        time.sleep(_POLL_S)
        return False
    if not sel.select(timeout=_POLL_S):
        return False
    chunk = os.read(fd, _READ_BYTES)
    if not chunk:
        sel.unregister(fd)
        return False
    return tee.feed(chunk)


def _why_stop(
    proc: subprocess.Popen[bytes],
    started_s: float,
    last_progress_s: float,
    deadline_s: float,
    idle_timeout_s: float,
    should_stop: Callable[[], bool] | None,
) -> _Stop | None:
    if proc.poll() is not None:
        return _Stop.EXITED
    if should_stop is not None and should_stop():
        return _Stop.STOPPED
    now_s = time.monotonic()
    if now_s - started_s > deadline_s:
        return _Stop.TIMED_OUT
    if now_s - last_progress_s > idle_timeout_s:
        return _Stop.HUNG
    return None


def _bury(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """Kill whatever is left of the group and reap the leader; a second Ctrl-C skips the grace."""
    try:
        kill_process_group(proc.pid, grace_s)
    except KeyboardInterrupt:
        _signal_group(proc.pid, signal.SIGKILL)
        raise
    finally:
        _reap(proc)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=_SIGKILL_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_group_gone(pgid: int, timeout_s: float, give_up: Callable[[], bool] | None = None) -> bool:
    end_s = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() >= end_s or (give_up is not None and give_up()):
            return False
        time.sleep(_GONE_POLL_S)
    return True


def group_alive(pgid: int) -> bool:
    """Public: True while a process of group `pgid` is running (zombies do not count)."""
    return _group_alive(pgid)


def _group_alive(pgid: int) -> bool:
    """True while a member of the group is running (zombies excluded where /proc tells)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    """Scan /proc for a non-zombie process in the group; without /proc assume one exists."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    return any(_live_in_group(pid, pgid) for pid in pids)


def _live_in_group(pid: str, pgid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    # "pid (comm) state ppid pgrp ..."; comm may contain spaces and parentheses.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 3:
        return False
    state, pgrp = fields[0], fields[2]
    return pgrp == str(pgid).encode() and state not in (b"Z", b"X")
