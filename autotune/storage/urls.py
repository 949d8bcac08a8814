"""Study storage: SQLAlchemy URLs (SQLite by default, PostgreSQL for many nodes) opened as Optuna storage."""

from __future__ import annotations

from pathlib import Path

import optuna
import sqlalchemy
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from autotune.errors import ConfigError, StorageError
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
    except ArgumentError:
        raise ConfigError(f"--storage {url!r} is not a database URL (expected e.g. sqlite:///path/autotune.db or "
                          "postgresql://user@host/db)") from None
    try:
        parsed.get_dialect().import_dbapi()
    except NoSuchModuleError:
        raise ConfigError(f"--storage {url!r}: unknown database type {parsed.drivername!r}") from None
    except ImportError as exc:
        raise ConfigError(f"--storage {redact(url)}: database driver {exc.name or exc} is not installed "
                          "(PostgreSQL: pip install 'psycopg[binary]')") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parent = Path(parsed.database).expanduser().parent
        if not parent.is_dir():
            raise ConfigError(f"--storage {url!r}: folder {parent} does not exist")
    return url


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Connect (creating Optuna's tables on first use); a failure is one StorageError line."""
    if is_journal_url(url):
        return open_journal_storage(url)
    check_storage_url(url)
    backend = make_url(url).get_backend_name()
    # SQLite: wait for a lock held by another process instead of failing at once.
    engine_kwargs = {"connect_args": {"timeout": 30}} if backend == "sqlite" else {"pool_pre_ping": True}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise StorageError(f"cannot open storage {redact(url)}: {reason}") from None


def redact(url: str) -> str:
    """The URL without its password, for messages and result files."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


__all__ = ["default_storage_url", "check_storage_url", "open_storage", "redact", "sqlalchemy"]
