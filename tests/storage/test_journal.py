"""A journal study hit by a full disk (issue 33 item 1): its torn last record is dropped with one warning line, the
study resumes and `show` reads it; a failed append leaves no torn record and names the file."""

import errno
import os
import subprocess
import sys

import optuna
import pytest

from autotune.errors import StorageUnavailable
from autotune.storage import journal

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


def test_a_journal_whose_last_record_was_torn_resumes_and_shows(tmp_path):
    log = tmp_path / "study.log"
    url = f"journal://{log}"
    run = ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--backend", "sim", "--storage", url, "--out",
           str(tmp_path), "--quiet"]
    assert _cli(*run, "--trials", "3").returncode == 0
    whole = log.read_bytes()
    log.write_bytes(whole[:-40])  # what a full disk leaves: the last record cut mid-line, no newline

    shown = _cli("show", "--storage", url, "--out", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.count("\n") == 1 and "last record was cut short" in shown.stderr
    assert log.read_bytes().endswith(b"\n") and len(log.read_bytes()) < len(whole) - 40

    resumed = _cli(*run, "--trials", "5")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    study = optuna.load_study(study_name="qwen2.5-1.5b-1x8-sim", storage=journal.open_journal_storage(url))
    assert len(study.trials) >= 5 and not [t for t in study.trials if t.state.name == "RUNNING"]


def test_a_torn_tail_a_later_record_was_appended_to_is_not_read_as_garbage(tmp_path):
    """Before: the next append joined the torn bytes into one line that is not JSON, unreadable for ever after."""
    log = tmp_path / "j.log"
    storage = journal.open_journal_storage(f"journal://{log}")
    optuna.create_study(study_name="s", storage=storage).add_trial(
        optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    with log.open("ab") as fh:
        fh.write(b'{"op_code":5,"worker_id":"x","trial_id":0,"st')
    storage = journal.open_journal_storage(f"journal://{log}")  # drops the torn tail before any append
    study = optuna.load_study(study_name="s", storage=storage)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=2.0))
    again = optuna.load_study(study_name="s", storage=journal.open_journal_storage(f"journal://{log}"))
    assert [t.value for t in again.trials] == [1.0, 2.0]


def test_a_full_disk_during_an_append_leaves_whole_records_and_names_the_file(tmp_path, monkeypatch):
    log = tmp_path / "j.log"
    url = f"journal://{log}"
    study = optuna.create_study(study_name="s", storage=journal.open_journal_storage(url))
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    real_fsync = os.fsync

    def full(fd):  # the write reached the disk only in part (once: the repair's own fsync then succeeds)
        monkeypatch.setattr(os, "fsync", real_fsync)
        os.ftruncate(fd, os.fstat(fd).st_size - 7)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageUnavailable) as info:
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=2.0))
    assert str(log) in str(info.value) and "disk is full" in str(info.value) and "\n" not in str(info.value)
    assert log.read_bytes().endswith(b"\n")
    again = optuna.load_study(study_name="s", storage=journal.open_journal_storage(url))
    again.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=3.0))
    reread = optuna.load_study(study_name="s", storage=journal.open_journal_storage(url))
    assert [t.value for t in reread.trials if t.state.name == "COMPLETE"][0] == 1.0
    assert [t.value for t in reread.trials][-1] == 3.0
