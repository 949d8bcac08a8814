"""Optuna's journal storage for a shared file system: `journal:///abs/path/autotune.log`.

An append-only log file instead of a database server. Safe for several processes on one node and for
nodes sharing NFS (Optuna's FAQ; SQLite is not), and each enqueued trial (the verl baseline) is run
exactly once (reference/optuna-ray.md section 5). It has no heartbeat: a dead worker's RUNNING trial
stays until `autotune run`/`worker` on that host fails it.

URL form: everything after `journal://` is the file path, so `journal:///shared/at.log` is
/shared/at.log and `journal://~/at.log` is in the home folder. Relative paths are taken from the
current folder.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.errors import ConfigError, StorageError

SCHEME = "journal://"


def is_journal_url(url: str) -> bool:
    return url.startswith(SCHEME)


def journal_path(url: str) -> Path:
    if not is_journal_url(url):
        raise ConfigError(f"--storage {url!r} is not a journal URL (expected journal:///path/to/file.log)")
    text = url[len(SCHEME):]
    if not text:
        raise ConfigError(f"--storage {url!r}: no file path (expected journal:///path/to/file.log)")
    return Path(text).expanduser().absolute()


def check_journal_url(url: str) -> str:
    """The file may not exist yet (it is created on first write) but its folder must."""
    path = journal_path(url)
    if path.is_dir():
        raise ConfigError(f"--storage {url!r}: {path} is a folder, not a journal file")
    if not path.parent.is_dir():
        raise ConfigError(f"--storage {url!r}: folder {path.parent} does not exist")
    return url


def open_journal_storage(url: str) -> optuna.storages.JournalStorage:
    check_journal_url(url)
    path = journal_path(url)
    try:
        # The default symlink lock works on NFS (Optuna's JournalFileBackend docs).
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    except OSError as exc:
        raise StorageError(f"cannot open storage {url}: {exc.strerror or exc}") from None
    except Exception as exc:  # a corrupt or foreign log file: Optuna raises plain errors while replaying it
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open storage {url}: not an Optuna journal ({reason})") from None
