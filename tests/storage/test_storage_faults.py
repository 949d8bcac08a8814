"""Storage faults during a study (issue 7): a locked database, a PostgreSQL restart, a full disk.
Nothing finished is lost; the run either rides it out or stops with one clear line."""

import errno
import os
import sqlite3
import threading
import time
from pathlib import Path

import optuna
import pytest

from autotune.config import ProbeBudget, SearchOptions, TuneConfig
from autotune.errors import RunFolderError, StorageUnavailable
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import ProbeRunner
from autotune.backends.sim import SimRunner
from autotune.search.driver import run_study
from autotune.storage import urls
from autotune.workload import Workload


def _hold_lock(db: Path, seconds: float, started: threading.Event) -> None:
    conn = sqlite3.connect(db, timeout=5)
    conn.execute("BEGIN EXCLUSIVE")
    started.set()
    time.sleep(seconds)
    conn.rollback()
    conn.close()


def _storage(db: Path):
    # a short SQLite busy timeout, so the lock shows up as errors the retry layer must absorb
    return urls.rdb_storage(f"sqlite:///{db}", {"connect_args": {"timeout": 0.05}})


def test_a_locked_database_is_waited_out(tmp_path, monkeypatch):
    monkeypatch.setattr(urls, "STORAGE_RETRY_WAITS_S", (0.2, 0.4, 0.8, 1.6))
    db = tmp_path / "a.db"
    study = optuna.create_study(storage=_storage(db), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    started = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(db, 1.0, started))
    holder.start()
    started.wait()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)  # blocked for ~1 s, then succeeds
    holder.join()
    assert len(study.trials) == 5 and all(t.state.name == "COMPLETE" for t in study.trials)


def test_a_lock_held_too_long_stops_with_one_line_and_keeps_the_trials(tmp_path, monkeypatch):
    monkeypatch.setattr(urls, "STORAGE_RETRY_WAITS_S", (0.05, 0.05))
    db = tmp_path / "a.db"
    study = optuna.create_study(storage=_storage(db), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    started = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(db, 2.0, started))
    holder.start()
    started.wait()
    with pytest.raises(StorageUnavailable) as info:
        study.ask()
    holder.join()
    assert "database is locked" in str(info.value) and "\n" not in str(info.value)
    again = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
    assert [t.state.name for t in again.trials][:2] == ["COMPLETE", "COMPLETE"]


class DiskFullAfter(ProbeRunner):
    """TEST DOUBLE: simulated probes, then the run folder's disk fills up (ENOSPC) on probe `n`."""

    name = "sim"
    simulated = False

    def __init__(self, n: int) -> None:
        self.n, self.calls, self.sim = n, 0, SimRunner()

    def probe(self, request, report):
        self.calls += 1
        if self.calls >= self.n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(request.run_dir / "probe.yaml"))
        return self.sim.probe(request, report)


@pytest.mark.parametrize("error", ["pending_rollback", "integrity"])
def test_a_dead_transaction_is_retried_but_a_data_error_is_not(tmp_path, monkeypatch, error):
    """The chain a PostgreSQL restart produced mid-_get_trials (CI, 2026-12-02): AdminShutdown inside
    Optuna's fallback query, then PendingRollbackError wrapped in StorageInternalError. That is a lost
    connection and is retried; an IntegrityError in the same wrapper is bad data and is raised at once."""
    import sqlalchemy

    monkeypatch.setattr(urls, "STORAGE_RETRY_WAITS_S", (0.01, 0.01))
    storage = _storage(tmp_path / "a.db")
    study = optuna.create_study(storage=storage, study_name="s")
    calls = []
    original = optuna.storages.RDBStorage.get_all_studies

    def flaky(self):
        calls.append(1)
        if len(calls) == 1:
            cause = (sqlalchemy.exc.PendingRollbackError("Can't reconnect until invalid transaction is rolled back")
                     if error == "pending_rollback" else sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("dup")))
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from cause
        return original(self)

    monkeypatch.setattr(optuna.storages.RDBStorage, "get_all_studies", flaky)
    if error == "pending_rollback":
        assert [s.study_name for s in storage.get_all_studies()] == [study.study_name] and len(calls) == 2
    else:
        with pytest.raises(optuna.exceptions.StorageInternalError):
            storage.get_all_studies()
        assert len(calls) == 1


def test_a_full_disk_stops_the_study_with_the_cause_and_keeps_finished_trials(tmp_path):
    cfg = TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                     trials=20, storage_url=f"sqlite:///{tmp_path / 'a.db'}", study_name="d", out_dir=tmp_path,
                     seed=0, workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget(),
                     search=SearchOptions(warm_start=2))
    with pytest.raises(RunFolderError, match="No space left on device") as info:
        run_study(cfg, DiskFullAfter(3))
    assert "\n" not in str(info.value)
    study = optuna.load_study(study_name="d", storage=cfg.storage_url)
    measured = [t for t in study.trials if t.user_attrs.get("state") in ("measured", "simulated")]
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(measured) == 2 and len(failed) == 1 and "No space left on device" in failed[0].user_attrs["reason"]
    assert all(t.state.name != "RUNNING" for t in study.trials)


def test_a_full_database_disk_is_reported_as_such_at_once(tmp_path, monkeypatch):
    """SQLite's SQLITE_FULL is an OperationalError like a lock, but waiting cannot help (issue 20 item 10)."""
    import sqlalchemy

    monkeypatch.setattr(urls, "STORAGE_RETRY_WAITS_S", (5.0, 5.0))  # a retry would show in the time taken
    storage = _storage(tmp_path / "a.db")
    calls = []

    def full(self):
        calls.append(1)
        raise sqlalchemy.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))

    monkeypatch.setattr(optuna.storages.RDBStorage, "get_all_studies", full)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match="disk is full") as info:
        storage.get_all_studies()
    assert time.monotonic() - started < 1.0 and len(calls) == 1
    assert "\n" not in str(info.value) and "stopped answering" not in str(info.value)
    assert str(tmp_path / "a.db") in str(info.value)  # which disk to free (issue 33)


@pytest.mark.parametrize("writer", ["best_yaml", "result_json"])
def test_a_full_disk_leaves_no_empty_temporary_file(tmp_path, monkeypatch, writer):
    from autotune.verl.export import write_best_yaml
    from autotune.storage.results import write_result_json

    real = Path.write_text

    def full(self, text, *a, **kw):  # what ENOSPC does: the file is created, nothing fits in it
        real(self, "")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        if writer == "best_yaml":
            write_best_yaml(tmp_path / "best.yaml", {"trainer.n_gpus_per_node": 8}, "fsdp", ["test"])
        else:
            write_result_json(tmp_path / "result.json", {"best": None})
    assert list(tmp_path.iterdir()) == []


class LockedOnce:
    """TEST DOUBLE: a study storage whose `method` meets a locked database on its first call; all else is `real`."""

    def __init__(self, real, method: str) -> None:
        self.real, self.method, self.calls = real, method, 0

    def __getattr__(self, name):
        found = getattr(self.real, name)
        if name != self.method:
            return found

        def locked_once(*args, **kwargs):
            import sqlalchemy

            self.calls += 1
            if self.calls == 1:
                raise sqlalchemy.exc.OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked"))
            return found(*args, **kwargs)

        return locked_once


@pytest.mark.parametrize("method", ["create_new_trial", "set_trial_param", "set_trial_user_attr",
                                    "set_trial_state_values", "get_trial", "get_all_trials"])
def test_each_call_a_study_makes_is_retried(tmp_path, monkeypatch, method):
    """Optuna takes the retrying storage as it is: ask, suggest, user attributes, tell and reading trials all
    reach the database through its public methods, so a lock met in any of them is waited out."""
    monkeypatch.setattr(urls, "STORAGE_RETRY_WAITS_S", (0.01,))
    flaky = LockedOnce(optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}"), method)
    study = optuna.create_study(storage=urls.RetryingStorage(flaky), study_name="s")

    def objective(trial):
        trial.set_user_attr("state", "measured")
        return trial.suggest_float("x", 0, 1)

    study.optimize(objective, n_trials=1)
    assert flaky.calls >= 2 and [t.state.name for t in study.trials] == ["COMPLETE"]
    assert study.trials[0].user_attrs == {"state": "measured"}
