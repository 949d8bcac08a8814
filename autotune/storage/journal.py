"""Optuna's journal storage for a shared file system: `journal:///abs/path/autotune.log`.

An append-only log file instead of a database server. Safe for several processes on one node and for
nodes sharing NFS (Optuna's FAQ; SQLite is not), and each enqueued trial (the verl baseline) is run
exactly once (reference/optuna-ray.md section 5). It has no heartbeat: a dead worker's RUNNING trial
stays until `autotune run`/`worker` on that host fails it.

A record is one JSON line, appended in one write and fsynced. A full disk can still cut the last one short: then
the tail has no newline, and the next record appended to it would make one line that is not JSON, which Optuna
refuses to read, for ever after (issue 33). So a torn tail is dropped (one warning line) when the journal is
opened and when an append fails; a failed append then stops the run with a line naming the file.

URL form: everything after `journal://` is the file path, so `journal:///shared/at.log` is
/shared/at.log and `journal://~/at.log` is in the home folder. Relative paths are taken from the
current folder.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import optuna

from autotune.errors import ConfigError, StorageError, StorageUnavailable

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
    if path.exists() and not path.is_file():  # /dev/null, a pipe: appended to, never read back
        raise ConfigError(f"--storage {url!r}: {path} is not a regular file")
    if not path.parent.is_dir():
        raise ConfigError(f"--storage {url!r}: folder {path.parent} does not exist")
    return url


def open_journal_storage(url: str) -> optuna.storages.JournalStorage:
    check_journal_url(url)
    path = journal_path(url)
    # The default symlink lock works on NFS (Optuna's JournalFileBackend docs); held here too, to repair the tail.
    lock = optuna.storages.journal.JournalFileSymlinkLock(str(path))
    try:
        try:
            drop_torn_tail(path, lock)
        except OSError as exc:  # a read-only copy: Optuna's reader skips a torn last line, the trials are readable
            print(f"autotune: warning: {path}: its last record was cut short and cannot be dropped here "
                  f"({exc.strerror or exc}); reading the records before it", file=sys.stderr)
        return optuna.storages.JournalStorage(WholeRecordBackend(str(path), lock_obj=lock))
    except OSError as exc:
        raise StorageError(f"cannot open storage {url}: {exc.strerror or exc}") from None
    except Exception as exc:  # a corrupt or foreign log file: Optuna raises plain errors while replaying it
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open storage {url}: not an Optuna journal ({reason})") from None


class WholeRecordBackend(optuna.storages.journal.JournalFileBackend):
    """Optuna's journal file, whose failed append leaves no torn record behind and names the file."""

    def __init__(self, file_path: str, lock_obj) -> None:
        super().__init__(file_path, lock_obj=lock_obj)
        self.path, self.lock = Path(file_path), lock_obj

    def append_logs(self, logs: list) -> None:
        try:
            super().append_logs(logs)
        except OSError as exc:
            try:
                drop_torn_tail(self.path, self.lock)
            except OSError:
                pass  # the warning at the next open drops it then
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageUnavailable(f"the study journal's disk is full ({self.path}: {exc.strerror}); finished "
                                         "trials are stored, free some space and run the same command") from None
            raise StorageUnavailable(f"cannot write the study journal {self.path}: {exc.strerror or exc}") from None


TAIL_READ_BYTES = 1 << 16


def drop_torn_tail(path: Path, lock) -> int:
    """Cut a last record that has no newline (a write a full disk cut short) off the journal, under the journal's
    lock so that no append is under way; warn in one line. Returns the bytes dropped."""
    if not _torn(path):
        return 0
    lock.acquire()
    try:
        if not _torn(path):  # another process repaired it meanwhile
            return 0
        size = path.stat().st_size
        with path.open("r+b") as fh:
            end = size
            while end > 0:  # back to the newline that ends the last whole record
                start = max(0, end - TAIL_READ_BYTES)
                fh.seek(start)
                newline = fh.read(end - start).rfind(b"\n")
                if newline >= 0:
                    end = start + newline + 1
                    break
                end = start
            fh.truncate(end)
            os.fsync(fh.fileno())
    finally:
        lock.release()
    print(f"autotune: warning: {path}: its last record was cut short ({size - end} bytes, a full disk?); dropped it, "
          "the trials before it are kept", file=sys.stderr)
    return size - end


def _torn(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return False
            fh.seek(size - 1)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False
