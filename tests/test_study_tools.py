"""`autotune worker` (journal storage), `autotune dashboard` over HTTP and in headless Chromium, bad input."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.errors import ConfigError, StorageError
from autotune.storage.journal import check_journal_url, is_journal_url, journal_path, open_journal_storage

STUDY = "qwen2.5-1.5b-1x8-sim"
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
CHROMIUM = "/usr/bin/chromium"
# .ci/chromium.sh documents these; quic/networking/sync/component flags keep a headless run off the network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _autotune(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV)


def _worker(*args):
    return subprocess.Popen([sys.executable, "-m", "autotune", "worker", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def _ran(stdout: str) -> int:
    m = re.search(r"^worker \S+ ran (\d+) trial\(s\)", stdout, re.M)
    assert m, stdout
    return int(m.group(1))


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "out"
    proc = _autotune("run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--backend", "sim", "--trials", "12",
                     "--out", str(out), "--quiet", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    return out, f"sqlite:///{out / 'autotune.db'}"


def test_cli_registers_the_study_commands():
    proc = _autotune("--help")
    assert proc.returncode == 0
    for name in ("dashboard", "report", "worker"):
        assert re.search(rf"^\s+{name}\s", proc.stdout, re.M), proc.stdout


# ---- journal storage -------------------------------------------------------------------------------------

def test_journal_urls(tmp_path):
    assert is_journal_url("journal:///a/b.log") and not is_journal_url("sqlite:///a.db")
    assert journal_path("journal:///a/b.log") == Path("/a/b.log")
    assert journal_path("journal://~/b.log") == Path.home() / "b.log"
    with pytest.raises(ConfigError, match="does not exist"):
        check_journal_url(f"journal://{tmp_path}/missing/at.log")
    with pytest.raises(ConfigError, match="is a folder"):
        check_journal_url(f"journal://{tmp_path}")
    with pytest.raises(ConfigError, match="no file path"):
        journal_path("journal://")
    # Optuna skips a bad last line (a write cut short); a bad line before it is a broken journal
    (tmp_path / "junk.log").write_text("this is not\nan optuna journal\n")
    with pytest.raises(StorageError, match="not an Optuna journal"):
        open_journal_storage(f"journal://{tmp_path}/junk.log")


def test_two_workers_share_a_journal_file(tmp_path):
    url = f"journal://{tmp_path}/study.log"
    first = _autotune("run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--backend", "sim", "--trials", "1",
                      "--storage", url, "--out", str(tmp_path / "run"), "--quiet")
    assert first.returncode == 0, first.stderr
    workers = [_worker("--study", STUDY, "--storage", url, "--trials", "14", "--out", str(tmp_path / f"w{i}"),
                       "--quiet") for i in range(2)]
    outs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [o[1] for o in outs]
    study = optuna.load_study(study_name=STUDY, storage=open_journal_storage(url))
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == list(range(len(trials)))  # none lost, none twice
    assert len(trials) == 1 + sum(_ran(o[0]) for o in outs)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    finished = [t for t in trials if t.state.is_finished()]
    assert 14 <= len(finished) <= 15  # each worker checks the count before asking: at most one extra
    assert all(t.user_attrs.get("state") and t.user_attrs.get("reason") for t in finished)
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == 1
    shown = _autotune("show", "--storage", url)
    assert shown.returncode == 0 and "verl's default configuration" in shown.stdout


def test_worker_searches_the_space_the_study_was_started_with(tmp_path):
    tune = tmp_path / "tune.yaml"
    tune.write_text("fixed:\n  actor_engine: fsdp\nranges:\n  rollout_tp: [1, 2]\n")
    url = f"sqlite:///{tmp_path / 'at.db'}"
    first = _autotune("run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--backend", "sim", "--trials", "1",
                      "--storage", url, "--config", str(tune), "--out", str(tmp_path / "run"), "--quiet")
    assert first.returncode == 0, first.stderr
    proc = _autotune("worker", "--study", STUDY, "--storage", url, "--trials", "8", "--out", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr
    assert "SIMULATED" in proc.stdout
    study = optuna.load_study(study_name=STUDY, storage=url)
    candidates = [t.user_attrs["candidate"] for t in study.trials]
    assert len(candidates) >= 8
    assert {c["actor_engine"] for c in candidates} == {"fsdp"} and {c["rollout_tp"] for c in candidates} <= {1, 2}
    other = tmp_path / "other.yaml"
    other.write_text("fixed:\n  actor_engine: fsdp\nranges:\n  rollout_tp: [1, 2, 4]\n")
    assert main(["worker", "--study", STUDY, "--storage", url, "--config", str(other), "--out", str(tmp_path)]) == 2


@pytest.fixture
def odd_storages(tmp_path, sim_run):
    """Storages a worker or dashboard must refuse: empty, foreign study, a study for a GPU backend."""
    _, url = sim_run
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.storages.RDBStorage(empty)
    foreign = f"sqlite:///{tmp_path / 'foreign.db'}"
    optuna.create_study(study_name="plain", storage=foreign)
    gpu = f"sqlite:///{tmp_path / 'gpu.db'}"
    optuna.copy_study(from_study_name=STUDY, from_storage=url, to_storage=gpu)
    study = optuna.load_study(study_name=STUDY, storage=gpu)
    study.set_user_attr("identity", {**study.user_attrs["identity"], "backend": "verl"})
    return {"URL": url, "EMPTY": empty, "FOREIGN": foreign, "GPU": gpu, "OUT": str(tmp_path / "o"),
            "MISSING": f"journal://{tmp_path}/missing.log", "NODB": str(tmp_path / "nodb")}


@pytest.mark.parametrize("argv, message", [
    (["worker", "--study", "nope", "--storage", "URL", "--out", "OUT"], "no study 'nope' in"),
    (["worker", "--study", STUDY, "--storage", "EMPTY", "--out", "OUT"], "no studies in"),
    (["worker", "--study", STUDY, "--storage", "MISSING", "--out", "OUT"], "no study database at"),
    (["worker", "--study", "plain", "--storage", "FOREIGN", "--out", "OUT"], "was not created by autotune"),
    (["worker", "--study", STUDY, "--storage", "GPU", "--out", "OUT"], "probes with the verl backend"),
    (["worker", "--study", STUDY, "--storage", "mysql+nosuchdriver://x/y", "--out", "OUT"], "unknown database type"),
    (["dashboard", "--storage", "EMPTY", "--out", "OUT"], "no studies in"),
    (["dashboard", "--out", "NODB"], "no study database at"),
])
def test_bad_input_is_one_line_and_exit_2(odd_storages, capsys, argv, message):
    argv = [odd_storages.get(a, a) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: ") and message in err and err.count("\n") == 1, err


def test_bad_port_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--port", "70000"])
    assert exc.value.code == 2 and "TCP port" in capsys.readouterr().err


def test_dashboard_refuses_a_port_in_use(sim_run, capsys):
    out, _ = sim_run
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(["dashboard", "--out", str(out), "--port", str(busy.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert "cannot listen" in err and err.count("\n") == 1


# ---- dashboard over HTTP ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


@pytest.fixture
def dashboard(sim_run):
    out, _ = sim_run
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--out", str(out), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                _get(f"{base}/api/meta")
                break
            except OSError:
                assert time.monotonic() < deadline, "dashboard did not answer within 30 s"
                time.sleep(0.2)
        yield base, out
    finally:
        proc.terminate()
        stdout, _ = proc.communicate(timeout=10)
    assert f"open {base}/dashboard" in stdout


def test_dashboard_serves_the_study(dashboard):
    base, out = dashboard
    meta = json.loads(_get(f"{base}/api/meta"))
    assert meta["artifact_is_available"] is True and (out / "artifacts").is_dir()
    summaries = json.loads(_get(f"{base}/api/studies"))["study_summaries"]
    assert [s["study_name"] for s in summaries] == [STUDY]
    detail = json.loads(_get(f"{base}/api/studies/{summaries[0]['study_id']}"))
    assert detail["name"] == STUDY and len(detail["trials"]) == 12
    stored = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{out / 'autotune.db'}")
    for served, trial in zip(detail["trials"], stored.trials, strict=True):
        attrs = {a["key"]: a["value"] for a in served["user_attrs"]}
        assert served["number"] == trial.number and attrs["state"] == trial.user_attrs["state"]
        assert attrs["feasible"] == str(trial.user_attrs["feasible"])  # the dashboard shows user attrs as text


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/chromium.sh)")
def test_dashboard_renders_the_study_in_headless_chromium(dashboard):
    base, _ = dashboard
    summaries = json.loads(_get(f"{base}/api/studies"))["study_summaries"]
    study_id = summaries[0]["study_id"]
    profile = tempfile.mkdtemp(prefix="autotune-chromium-")
    try:
        proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000",
                               "--dump-dom", f"{base}/dashboard/studies/{study_id}"],
                              capture_output=True, text=True, timeout=90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the page's HTML holds no study name: only the rendered React app does
    assert STUDY.encode() not in _get(f"{base}/dashboard/studies/{study_id}")
    assert f"{STUDY} (id={study_id})" in proc.stdout
