"""Study storage: SQLAlchemy URLs (SQLite by default, PostgreSQL for many nodes) opened as Optuna storage."""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from pathlib import Path

import optuna
import sqlalchemy
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from autotune.errors import ConfigError, StorageError, StorageUnavailable
from autotune.storage.journal import check_journal_url, is_journal_url, open_journal_storage

DB_FILENAME = "autotune.db"


def default_storage_url(out_dir: Path) -> str:
    return f"sqlite:///{(Path(out_dir) / DB_FILENAME).resolve()}"


def check_storage_url(url: str) -> str:
    """Parse the URL and make sure its driver is importable; never touches the database."""
    if is_journal_url(url):
        return check_journal_url(url)
    try:
        parsed = make_url(url)
        parsed.port  # SQLAlchemy converts it lazily: a port that is not a number raises ValueError here
    except ValueError as exc:
        raise ConfigError(f"--storage {redact(url)!r}: the port must be a number") from None
    except ArgumentError:
        raise ConfigError(f"--storage {redact(url)!r} is not a database URL (expected e.g. sqlite:///path/autotune.db "
                          "or postgresql://user@host/db)") from None
    try:
        parsed.get_dialect().import_dbapi()
    except NoSuchModuleError:
        raise ConfigError(f"--storage {redact(url)!r}: unknown database type {parsed.drivername!r}") from None
    except ImportError as exc:
        raise ConfigError(f"--storage {redact(url)}: database driver {exc.name or exc} is not installed "
                          "(PostgreSQL: pip install 'psycopg[binary]')") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parent = Path(parsed.database).expanduser().parent
        if not parent.is_dir():
            raise ConfigError(f"--storage {redact(url)!r}: folder {parent} does not exist")
    return url


STORAGE_RETRY_WAITS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # ~30 s: a database restart or a held lock

# A lost connection or a lock. PendingRollbackError belongs here: when a server restart kills the
# connection inside a call, Optuna's _get_trials catches the first error and retries in the same
# session, whose dead transaction then raises it ("Can't reconnect until invalid transaction is
# rolled back"); Optuna's session wrapper rolls back, so the repeated call runs on a new connection.
_TRANSIENT = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.PendingRollbackError)


def _retrying(name: str):
    original = getattr(optuna.storages.RDBStorage, name)

    def call(self, *args, **kwargs):
        for wait_s in STORAGE_RETRY_WAITS_S + (None,):
            try:
                return original(self, *args, **kwargs)
            except (*_TRANSIENT, optuna.exceptions.StorageInternalError) as exc:
                cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) else exc
                if not isinstance(cause, _TRANSIENT):
                    raise  # a real error in the data, not a lost connection or a lock: never retried
                exc = cause
                full = _disk_full(exc)
                if full:
                    raise StorageUnavailable(f"the study database's disk is full ({full}); finished trials are "
                                             "stored, free some space and run the same command") from None
                if wait_s is None:
                    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
                    raise StorageUnavailable(
                        f"the study database stopped answering ({reason}) for {sum(STORAGE_RETRY_WAITS_S):.0f} s; "
                        "finished trials are stored, run the same command to resume") from None
                from autotune import interrupt

                interrupt.check()  # the failed call changed nothing: a stop request need not wait out the back-off
                time.sleep(wait_s)

    call.__name__ = name
    call.__doc__ = original.__doc__
    return call


def _disk_full(exc: Exception) -> str | None:
    """The reason, when a storage error means a full disk: retrying cannot help (SQLite's SQLITE_FULL,
    PostgreSQL's SQLSTATE 53100 disk_full, https://www.postgresql.org/docs/current/errcodes-appendix.html)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
    if getattr(orig, "sqlstate", None) == "53100" or getattr(orig, "pgcode", None) == "53100" \
            or "database or disk is full" in text or "No space left on device" in text:
        return text or "no space left on device"
    return None


class RetryingRDBStorage(optuna.storages.RDBStorage):
    """RDBStorage whose every call is retried on a lost connection or a locked database, with back-off.

    A PostgreSQL restart or another worker holding SQLite's write lock then costs a pause, not the run;
    each storage call is one transaction, so a call that failed did not happen and is safe to repeat.
    """


# every call that reaches the database, the private ones Optuna's _CachedStorage uses included
_DB_CALLS = optuna.storages.BaseStorage.__abstractmethods__ | {
    "get_n_trials", "get_best_trial", "get_trial_id_from_study_id_trial_number", "record_heartbeat",
    "_create_new_trial", "_get_best_trial_id", "_get_stale_trial_ids", "_get_trials", "_set_trial_param"}
for _name in sorted(_DB_CALLS):
    if hasattr(optuna.storages.RDBStorage, _name):
        setattr(RetryingRDBStorage, _name, _retrying(_name))


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Connect (creating Optuna's tables on first use); a failure is one StorageError line."""
    if is_journal_url(url):
        return open_journal_storage(url)
    check_storage_url(url)
    backend = make_url(url).get_backend_name()
    # SQLite: wait for a lock held by another process instead of failing at once.
    engine_kwargs = {"connect_args": {"timeout": 30}} if backend == "sqlite" else {"pool_pre_ping": True}
    try:
        return RetryingRDBStorage(url, engine_kwargs=engine_kwargs)
    except (SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise StorageError(f"cannot open storage {redact(url)}: {reason}") from None


def redact(url: str) -> str:
    """The URL without its password, for messages and result files (also one SQLAlchemy cannot parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)


_HELD: dict[Path, int] = {}  # lock files this process holds (flock is per open file: never open one twice)


def hold_single_writer(url: str) -> None:
    """SQLite takes one writer process (Optuna FAQ; two workers on one file ran the same trial and crashed):
    hold an exclusive lock next to the database for this process's life, or stop with one line."""
    if is_journal_url(url):
        return
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    lock_path = Path(parsed.database + ".lock").expanduser().resolve()
    if lock_path in _HELD:
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"the study database {parsed.database} is in use by another autotune process ({holder}); "
                          "SQLite takes one writer: for several workers use PostgreSQL (--storage "
                          "postgresql+psycopg://...) or a journal file (--storage journal:///shared/study.log)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    _HELD[lock_path] = fd  # released by the kernel when the process ends, however it ends


__all__ = ["default_storage_url", "check_storage_url", "open_storage", "redact", "sqlalchemy"]
