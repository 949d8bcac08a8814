"""Several `autotune worker` processes on one PostgreSQL study: no trial lost, none run twice.

Needs a server: AUTOTUNE_TEST_POSTGRES_URL (CI sets it from `.ci/postgres.sh`); skipped otherwise.
"""

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

URL = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL", "")
WORKERS = 3
TRIALS = 36
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _reachable(url: str) -> str | None:
    """None when a server answers, else why not."""
    if not url:
        return "AUTOTUNE_TEST_POSTGRES_URL is not set (bash .ci/postgres.sh prints one)"
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # any driver or connection failure means: no server to test against
        return f"no PostgreSQL server at AUTOTUNE_TEST_POSTGRES_URL: {str(exc).splitlines()[0]}"
    return None


pytestmark = pytest.mark.skipif(_reachable(URL) is not None, reason=_reachable(URL) or "")


@pytest.fixture
def study_name():
    name = f"pg-test-{uuid.uuid4().hex[:10]}"
    yield name
    try:
        optuna.delete_study(study_name=name, storage=URL)
    except KeyError:
        pass


def test_parallel_workers_share_one_study(tmp_path, study_name):
    first = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-1.5b", "--gpus", "8",
                            "--backend", "sim", "--trials", "1", "--storage", URL, "--study", study_name,
                            "--out", str(tmp_path / "run"), "--quiet"],
                           capture_output=True, text=True, timeout=120, env=ENV)
    assert first.returncode == 0, first.stderr
    workers = [subprocess.Popen([sys.executable, "-m", "autotune", "worker", "--study", study_name, "--storage", URL,
                                 "--trials", str(TRIALS), "--out", str(tmp_path / f"w{i}"), "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
               for i in range(WORKERS)]
    outs = [w.communicate(timeout=180) for w in workers]
    assert [w.returncode for w in workers] == [0] * WORKERS, [err for _, err in outs]
    ran = [int(re.search(r"^worker \S+ ran (\d+) trial\(s\)", out, re.M).group(1)) for out, _ in outs]
    pids = {w.pid for w in workers}

    study = optuna.load_study(study_name=study_name, storage=URL)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 1 + sum(ran)  # every trial a worker ran is stored, and nothing else appeared
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # unique numbers, no gaps
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # a trial that found its configuration in flight on another worker steps aside (issue 20): not counted
    skipped = [t for t in trials if t.user_attrs.get("state") == "skipped"]
    for t in skipped:
        assert not t.user_attrs.get("launched") and trials[t.user_attrs["claimed_by"]].params == t.params
    finished = [t for t in trials if t.state.is_finished() and t not in skipped]
    assert TRIALS <= len(finished) <= TRIALS + WORKERS - 1  # each worker checks the count before it asks
    launched = [repr(sorted(t.params.items())) for t in sorted(trials, key=lambda t: t.datetime_start)
                if t.user_attrs.get("launched") and "retry_of" not in t.user_attrs]
    repeated = len(launched) - len(set(launched))
    assert repeated <= 0.05 * len(launched), f"{repeated} of {len(launched)} probes repeated a configuration"
    assert all(t.user_attrs.get("state") and t.user_attrs.get("reason") for t in finished)
    # enqueued trials (verl's default, the warm start) are popped under SELECT ... FOR UPDATE: each runs once
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1
    warm = [t.user_attrs["warm_start"] for t in trials if "warm_start" in t.user_attrs]
    assert len(warm) == len(set(warm))
    by_worker = {t.user_attrs.get("pid") for t in trials[1:]}
    assert by_worker <= pids and len(by_worker) >= 2  # the workers really ran side by side


PG_DATA = os.environ.get("AUTOTUNE_PG_DIR", "/var/lib/postgresql/autotune-ci")


def _pg_ctl() -> str | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return str(found[-1]) if found else None


@pytest.mark.skipif(not URL or not _pg_ctl() or not Path(PG_DATA).is_dir(),
                    reason="needs the CI PostgreSQL server (bash .ci/postgres.sh)")
# here, not with the other storage faults: a restart ends every connection to the server, so this test must not run
# beside the other PostgreSQL tests (pytest-xdist's --dist loadfile keeps one file on one worker)
def test_postgresql_restart_in_the_middle_of_a_study(tmp_path):
    study_name = f"restart-{os.getpid()}-{int(time.time())}"
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-7b", "--gpus", "8",
                             "--backend", "sim", "--trials", "60", "--storage", URL, "--study", study_name,
                             "--out", str(tmp_path), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if len(optuna.load_study(study_name=study_name, storage=URL).trials) >= 10:
                break
        except KeyError:
            pass
        time.sleep(0.5)
    # the server must not hold our pipes (it would outlive the call): its log goes to its own file
    subprocess.run(["runuser", "-u", "postgres", "--", _pg_ctl(), "-D", PG_DATA, "-l", f"{PG_DATA}/server.log", "-w",
                    "-m", "fast", "restart"], check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    study = optuna.load_study(study_name=study_name, storage=URL)
    assert len(study.trials) == 60 and all(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials)
