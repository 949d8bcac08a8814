"""Study storage: SQLAlchemy URLs (SQLite by default, PostgreSQL for many nodes) opened as Optuna storage."""

from __future__ import annotations

import abc
import fcntl
import os
import re
import socket
import tempfile
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
    except ValueError:
        raise ConfigError(f"--storage {redact(url)!r}: the port must be a number") from None
    except ArgumentError:
        raise ConfigError(f"--storage {redact(url)!r} is not a database URL (expected e.g. sqlite:///path/autotune.db "
                          "or postgresql://user@host/db)") from None
    try:
        parsed.get_dialect().import_dbapi()
    except NoSuchModuleError:
        hint = ""
        if parsed.drivername.split("+")[0] in ("postgres", "pg", "postgre"):  # Heroku-style; SQLAlchemy 1.4 dropped it
            hint = f" (PostgreSQL is {redact(str(parsed.set(drivername='postgresql+psycopg')))})"
        raise ConfigError(f"--storage {redact(url)!r}: unknown database type {parsed.drivername!r}{hint}") from None
    except ImportError as exc:
        raise ConfigError(f"--storage {redact(url)}: database driver {exc.name or exc} is not installed "
                          "(PostgreSQL: pip install 'psycopg[binary]')") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):  # SQLite's in-memory database: gone when the run ends
            raise ConfigError(f"--storage {redact(url)!r}: no database file; an in-memory study cannot be resumed "
                              "or shown (give sqlite:////path/to/autotune.db)")
        database = Path(parsed.database).expanduser()
        if not database.parent.is_dir():
            raise ConfigError(f"--storage {redact(url)!r}: folder {database.parent} does not exist")
        if database.exists() and not database.is_file():
            raise ConfigError(f"--storage {redact(url)!r}: {database} is not a regular file")
    return url


# SQLite waits this long for another process's lock inside one call, in C, where a signal is not seen: a stop came
# only after its 30 s (issue 33). Longer locks are waited out by call_with_retry's back-off, which a stop ends.
SQLITE_BUSY_TIMEOUT_S = 0.5
STORAGE_RETRY_WAITS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # ~30 s: a database restart or a held lock

# A lost connection or a lock. PendingRollbackError belongs here: when a server restart kills the
# connection inside a call, Optuna's RDBStorage (optuna/storages/_rdb/storage.py, _get_trials) catches
# the first error and retries in the same session, whose dead transaction then raises it ("Can't
# reconnect until invalid transaction is rolled back"); Optuna's session wrapper rolls back, so the
# repeated call runs on a new connection.
_TRANSIENT = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.PendingRollbackError)


def call_with_retry(call, *args, database: str = "the study database", **kwargs):
    """`call(*args, **kwargs)`, repeated with back-off while the database is lost or locked.

    Each storage call is one transaction, so a call that failed did not happen and is safe to repeat. A full
    disk or a real error in the data is raised at once; a database gone for all of STORAGE_RETRY_WAITS_S
    stops the run with one StorageUnavailable line.
    """
    for wait_s in STORAGE_RETRY_WAITS_S + (None,):
        try:
            return call(*args, **kwargs)
        except (*_TRANSIENT, optuna.exceptions.StorageInternalError) as exc:
            cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) else exc
            if not isinstance(cause, _TRANSIENT):
                raise  # a real error in the data, not a lost connection or a lock: never retried
            full = _disk_full(cause)
            if full:
                raise StorageUnavailable(f"{database}: the disk is full ({full}); finished trials are stored, free "
                                         "some space and run the same command") from None
            if wait_s is None:
                reason = str(getattr(cause, "orig", None) or cause).strip().splitlines()[0]
                raise StorageUnavailable(
                    f"{database} stopped answering ({reason}) for {sum(STORAGE_RETRY_WAITS_S):.0f} s; "
                    "finished trials are stored, run the same command to resume") from None
            from autotune import interrupt

            interrupt.patient_sleep(wait_s)  # the failed call changed nothing: a stop need not wait out the back-off


def _disk_full(exc: Exception) -> str | None:
    """The reason, when a storage error means a full disk: retrying cannot help (SQLite's SQLITE_FULL,
    PostgreSQL's SQLSTATE 53100 disk_full, https://www.postgresql.org/docs/current/errcodes-appendix.html)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
    if getattr(orig, "sqlstate", None) == "53100" or getattr(orig, "pgcode", None) == "53100" \
            or "database or disk is full" in text or "No space left on device" in text:
        return text or "no space left on device"
    return None


class RetryingStorage(optuna.storages.BaseStorage):
    """An Optuna storage whose every call goes to `inner` through call_with_retry.

    A PostgreSQL restart or another worker holding SQLite's write lock then costs a pause, not the run. Only
    BaseStorage's public methods are used: Optuna takes any storage that is not an RDBStorage as it is
    (optuna.storages.get_storage, optuna 5.1 storages/__init__.py:41-55), and `inner` may be any storage,
    Optuna's cache in front of an RDBStorage included (open_storage).
    """

    def __init__(self, inner: optuna.storages.BaseStorage, database: str = "the study database") -> None:
        self.inner = inner
        self.database = database  # named in the one line that stops the run (the file, or the redacted URL)


def _forward(name: str):
    def call(self, *args, **kwargs):
        return call_with_retry(getattr(self.inner, name), *args, database=self.database, **kwargs)

    call.__name__ = name
    call.__doc__ = getattr(optuna.storages.BaseStorage, name).__doc__
    return call


# every public method of Optuna's storage interface, the abstract ones and those with a default (an RDBStorage
# answers get_n_trials or get_trial_id_from_study_id_trial_number with one query, the default reads all trials)
for _name, _member in vars(optuna.storages.BaseStorage).items():
    if callable(_member) and not _name.startswith("_"):
        setattr(RetryingStorage, _name, _forward(_name))
abc.update_abstractmethods(RetryingStorage)  # each abstract one is now forwarded


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Connect (creating Optuna's tables on first use); a failure is one StorageError line."""
    if is_journal_url(url):
        return open_journal_storage(url)
    check_storage_url(url)
    backend = make_url(url).get_backend_name()
    engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if backend == "sqlite" \
        else {"pool_pre_ping": True}
    try:
        return _open_waiting_out_a_lock(url, engine_kwargs)
    except (SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise StorageError(f"cannot open storage {redact(url)}: {redact_in(reason, url)}") from None


def _open_waiting_out_a_lock(url: str, engine_kwargs: dict) -> "RetryingStorage":
    """rdb_storage, with another process's lock (met creating or checking the tables) waited out as call_with_retry
    waits; any other error (no such folder, no server) is raised at once."""
    from autotune import interrupt

    for wait_s in STORAGE_RETRY_WAITS_S + (None,):
        try:
            return rdb_storage(url, engine_kwargs)
        except sqlalchemy.exc.OperationalError as exc:
            if wait_s is None or "locked" not in str(exc.orig):
                raise
            interrupt.patient_sleep(wait_s)


def rdb_storage(url: str, engine_kwargs: dict) -> RetryingStorage:
    """Optuna's RDBStorage with what Optuna itself puts in front of one, its cache of finished trials, and the
    retry around both.

    The cache, from `optuna.storages.get_storage` (the call create_study and load_study make on every storage;
    public by name, "only for internal usage" by its docstring), reads only the new and unfinished trials: a
    60-trial study without it spent 3x the CPU (benchmarks/results/storage_retry_cost.txt). It adds to its
    state only after its database call succeeded (optuna 5.1 storages/_cached_storage.py), so a failed call is
    repeated from an unchanged cache.
    """
    parsed = make_url(url)
    database = (f"the study database {parsed.database}" if parsed.get_backend_name() == "sqlite"
                else f"the study database {redact(url)}")
    return RetryingStorage(optuna.storages.get_storage(optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)),
                           database)


# query-string keys that carry a secret: libpq's password and sslpassword, tokens and keys of cloud drivers
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|key|auth|cred", re.I)
_MASK = "***"


def redact(url: str) -> str:
    """The URL without its secrets, for messages and result files: the password of `user:pw@host` and the value of
    every secret-looking query key (`?password=...`); also for a URL SQLAlchemy cannot parse."""
    try:
        parsed = make_url(url)
        secret = [k for k in parsed.query if _SECRET_KEY.search(k)]
        text = parsed.render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _redact_text(url)
    if secret:  # masked in the rendered text: through SQLAlchemy the mask would come out percent-quoted
        text = _redact_text(text)
    return text


def _redact_text(url: str) -> str:
    text = re.sub(r"(//[^/@:]*:)[^/@]*@", rf"\1{_MASK}@", url)
    return re.sub(r"([?&;][^=&;#]*(?:pass|pwd|secret|token|key|auth|cred)[^=&;#]*=)[^&;#]*", rf"\1{_MASK}", text,
                  flags=re.I)


def redact_in(text: str, url: str) -> str:
    """`text` (a driver's error) with each secret of `url` masked wherever it appears."""
    try:
        parsed = make_url(url)
        secrets = [parsed.password] + [v for k, values in parsed.query.items() if _SECRET_KEY.search(k)
                                       for v in ((values,) if isinstance(values, str) else values)]
    except (ArgumentError, ValueError):
        secrets = re.findall(r"//[^/@:]*:([^/@]*)@", url) + re.findall(
            r"[?&;][^=&;#]*(?:pass|pwd|secret|token|key|auth|cred)[^=&;#]*=([^&;#]*)", url, flags=re.I)
    for secret in secrets:
        if secret:
            text = text.replace(str(secret), _MASK)
    return text


_HELD: dict[Path, int] = {}  # lock files this process holds (flock is per open file: never open one twice)
# One lock per database file, whatever path reaches it (a hard link, a bind mount): named by device and inode. It is
# this machine's; the lock next to the database also stops a second host that reaches the same path over NFS.
IDENTITY_LOCK_DIR = Path(tempfile.gettempdir()) / "autotune-sqlite-locks"


def hold_single_writer(url: str) -> None:
    """SQLite takes one writer process (Optuna FAQ; two workers on one file ran the same trial and crashed):
    hold an exclusive lock on the database file's identity and next to it for this process's life, or stop with
    one line."""
    if is_journal_url(url):
        return
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    database = Path(parsed.database).expanduser()
    try:  # the file must exist to have an identity: an empty file is a new SQLite database
        os.close(os.open(database, os.O_RDWR | os.O_CREAT, 0o644))
        identity = database.stat()
    except OSError as exc:
        raise StorageError(f"cannot create the study database {database}: {exc.strerror or exc}") from None
    _hold(Path(str(database.resolve()) + ".lock"), parsed.database)
    try:
        IDENTITY_LOCK_DIR.mkdir(exist_ok=True)
        if IDENTITY_LOCK_DIR.stat().st_uid == os.getuid():
            IDENTITY_LOCK_DIR.chmod(0o1777)  # every user's databases, each user's own lock files (sticky)
        by_identity = IDENTITY_LOCK_DIR / f"{identity.st_dev}-{identity.st_ino}.lock"
        _hold(by_identity, parsed.database)
    except PermissionError:
        pass  # another user's lock folder or file: the lock next to the database still stands


def _hold(lock_path: Path, database: str) -> None:
    if lock_path in _HELD:
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"the study database {database} is in use by another autotune process ({holder}); "
                          "SQLite takes one writer: for several workers use PostgreSQL (--storage "
                          "postgresql+psycopg://...) or a journal file (--storage journal:///shared/study.log)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    _HELD[lock_path] = fd  # released by the kernel when the process ends, however it ends


__all__ = ["default_storage_url", "check_storage_url", "open_storage", "redact", "redact_in", "sqlalchemy"]
