"""Fault-injection campaigns for the study driver (issue 20): kill -9, parallel workers, signals.

    python benchmarks/faults.py [--quick] [--postgres URL] [--seed N]

Campaigns (the real CLI in subprocesses, on the sim backend slowed to PROBE_STEP_S per step so that
probes overlap and a kill can land inside one; the orphan campaign runs the verl backend with the
main_ppo TEST DOUBLE of tests/backends/verl/verl_double, whose probe spawns grandchildren and hangs):

- kill9:   `autotune run` SIGKILLed at random moments (from start-up to late in a probe), then the
           same command again, until the study holds all its trials.
- orphans: the tuner SIGKILLed right as its probe starts (as soon as probe.pgid appears, after a
           random 0-200 ms), then the next run; counts probe processes still alive after it.
- workers: one `autotune run` and three `autotune worker`s on one study, on PostgreSQL and on a
           journal file; counts probes that repeated a configuration in flight or already probed.
- signals: SIGTERM, SIGINT, SIGHUP and a double SIGINT at random moments (from validation on).

Printed counts: lost finished trials, duplicated probe rows (a configuration probed twice outside an
explicit retry), trials left RUNNING, orphaned probe processes, result.json files without a baseline,
repeated-probe percentage per storage. Exit code 1 if any count is off target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ROOT / "tests" / "backends" / "verl" / "verl_double"
PROBE_STEP_S = 0.3
MODEL = ["--model", "qwen2.5-7b", "--gpus", "8"]
STUDY = "qwen2.5-7b-1x8-sim"

# ---- the tuner as a subprocess: the real CLI with the sim probe slowed down --------------------------------

SLOW_CLI = r"""
import os, signal, sys, time
def stop_early(signum, frame):  # as autotune/__main__.py does while the CLI loads
    os.write(2, b"autotune: interrupted; finished trials are stored, run the same command to resume\n")
    os._exit(130)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, stop_early)
from autotune.backends import sim
step_s = float(sys.argv[1])
orig = sim.SimRunner.probe
def probe(self, request, report):
    def slow(step, value):
        time.sleep(step_s)
        return report(step, value)
    time.sleep(step_s)
    return orig(self, request, slow)
sim.SimRunner.probe = probe
if os.environ.get("AUTOTUNE_FAULTS_NO_CLAIMS"):  # --no-claims: the behaviour issue 20 measured
    import optuna
    from autotune.search import lease
    lease.claim = lambda study, trial: None
    enqueue = optuna.Study.enqueue_trial
    optuna.Study.enqueue_trial = lambda self, params, user_attrs=None, skip_if_exists=False: enqueue(
        self, params, user_attrs)
from autotune.cli import main
sys.exit(main(sys.argv[2:]))
"""

VERL_TUNER = r"""
import os, sys
from pathlib import Path
from autotune import interrupt
from autotune.config import ProbeBudget, SearchOptions, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.verl.runner import ProbeLimits, VerlRunner
from autotune.search.driver import run_study
from autotune.workload import Workload
out = Path(sys.argv[1]); trials = int(sys.argv[2])
cfg = TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="verl",
                 trials=trials, storage_url=f"sqlite:///{out / 'autotune.db'}", study_name="k", out_dir=out, seed=0,
                 workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget(),
                 search=SearchOptions(warm_start=1))
interrupt.install()
run_study(cfg, VerlRunner(limits=ProbeLimits(deadline_s=600, idle_timeout_s=600, kill_grace_s=2), env=dict(os.environ)))
"""


def _env(**extra) -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "AUTOTUNE_HEARTBEAT_S": "1", **extra}


def tuner(args: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, str(PROBE_STEP_S), *args], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)


def run_args(out: Path, trials: int, storage: str | None = None) -> list[str]:
    return ["run", *MODEL, "--backend", "sim", "--trials", str(trials), "--out", str(out), "--quiet",
            *(["--storage", storage] if storage else [])]


# ---- what a study holds ------------------------------------------------------------------------------------

def load(storage: str, name: str = STUDY) -> optuna.Study:
    from autotune.storage.urls import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage))


def finished(study: optuna.Study) -> dict[int, tuple]:
    """Finished trials with an outcome (not interrupted, not skipped): number -> (state, values)."""
    return {t.number: (t.state.name, t.values) for t in study.get_trials(deepcopy=False)
            if t.state.is_finished() and not t.user_attrs.get("interrupted")
            and t.user_attrs.get("state") != "skipped"}


def repeats(study: optuna.Study) -> tuple[int, int]:
    """(launched probes, probes of a configuration already probed or in flight, explicit retries excluded)."""
    launched = sorted((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("launched")),
                      key=lambda t: t.datetime_start)
    seen: dict[str, int] = {}
    repeated = 0
    for t in launched:
        key = json.dumps(t.params, sort_keys=True)
        if key in seen and t.user_attrs.get("retry_of") is None:
            repeated += 1
        seen.setdefault(key, t.number)
    return len(launched), repeated


def running(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def baseline_ok(out: Path) -> bool:
    try:
        doc = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return False
    return doc.get("baseline") is not None and doc.get("speedup_vs_baseline") is not None


class Tally:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, campaign: str, **counts) -> None:
        self.rows.append({"campaign": campaign, **counts})
        print(f"  {campaign}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)


# ---- campaigns ---------------------------------------------------------------------------------------------

def kill9(tmp: Path, rng: random.Random, rounds: int, trials: int, tally: Tally) -> None:
    out = tmp / "kill9"
    storage = f"sqlite:///{out / 'autotune.db'}"
    lost = kills = 0
    seen: dict[int, tuple] = {}
    for i in range(rounds):
        proc = tuner(run_args(out, trials))
        time.sleep(rng.uniform(0.3, 6.0) if i else rng.uniform(0.3, 2.5))  # the first one often in trial 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        if (out / "autotune.db").exists():
            try:
                now = finished(load(storage))
            except (KeyError, optuna.exceptions.OptunaError, Exception):  # noqa: BLE001 - killed before creating it
                continue
            lost += sum(1 for n, v in seen.items() if now.get(n) != v)
            seen = now
    final = tuner(run_args(out, trials))
    rc = final.wait()
    study = load(storage)
    lost += sum(1 for n, v in seen.items() if finished(study).get(n) != v)
    launched, dup = repeats(study)
    tally.add("kill9", kills=kills, final_exit=rc, lost=lost, duplicated=dup, running_left=running(study),
              baseline_missing=0 if baseline_ok(out) else 1, launched=launched)


def _probe_processes(mark: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if mark.encode() in cmd and stat[stat.rfind(")") + 2] not in "ZX":
            pids.append(int(pid))
    return pids


def orphans(tmp: Path, rng: random.Random, rounds: int, tally: Tally) -> None:
    out = tmp / "orphans"
    out.mkdir()
    mark = f"faults-orphan-{os.getpid()}"
    kills = 0
    for i in range(rounds):
        env = _env(PYTHONPATH=f"{DOUBLE}{os.pathsep}{ROOT}", AUTOTUNE_VERL_DOUBLE="spawn",
                   AUTOTUNE_VERL_DOUBLE_MARK=mark)
        proc = subprocess.Popen([sys.executable, "-c", VERL_TUNER, str(out), str(i + 2)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((out / "runs").glob("*/probe.pgid")):
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    env = _env(PYTHONPATH=f"{DOUBLE}{os.pathsep}{ROOT}", AUTOTUNE_VERL_DOUBLE="ok")
    final = subprocess.run([sys.executable, "-c", VERL_TUNER, str(out), str(rounds + 2)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    time.sleep(0.5)
    left = _probe_processes(mark)
    for pid in left:  # clean up after a failed campaign
        os.kill(pid, signal.SIGKILL)
    study = load(f"sqlite:///{out / 'autotune.db'}", "k")
    tally.add("orphans", kills=kills, final_exit=final.returncode, orphaned=len(left), running_left=running(study))


def workers(tmp: Path, storage: str, label: str, trials: int, tally: Tally) -> None:
    out = tmp / f"workers-{label}"
    name = f"faults-{label}-{os.getpid()}-{int(time.time())}"  # its own study: the server may be shared
    procs = [tuner([*run_args(out, trials, storage), "--study", name])]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the workers join once the run has created the study
        try:
            load(storage, name)
            break
        except Exception:  # noqa: BLE001 - not created yet
            time.sleep(0.3)
    for i in range(3):
        procs.append(tuner(["worker", "--study", name, "--storage", storage, "--trials", str(trials),
                            "--out", str(tmp / f"w{label}{i}"), "--quiet"]))
    rcs = [p.wait(timeout=900) for p in procs]
    study = load(storage, name)
    launched, rep = repeats(study)
    skipped = sum(t.user_attrs.get("state") == "skipped" for t in study.trials)
    tally.add(f"workers-{label}", exit_codes=rcs, launched=launched, repeated=rep,
              repeated_pct=round(100 * rep / max(launched, 1), 1), skipped=skipped, running_left=running(study),
              baseline_missing=0 if baseline_ok(out) else 1)
    if not storage.startswith("journal:"):
        optuna.delete_study(study_name=name, storage=storage)  # leave the shared server as it was


def signals(tmp: Path, rng: random.Random, rounds: int, tally: Tally) -> None:
    kinds = [("SIGTERM", [signal.SIGTERM]), ("SIGINT", [signal.SIGINT]), ("SIGHUP", [signal.SIGHUP]),
             ("double SIGINT", [signal.SIGINT, signal.SIGINT])]
    bad_exit = running_left = multiline = 0
    cases = 0
    codes = []
    for i in range(rounds):
        name, sigs = kinds[i % len(kinds)]
        out = tmp / f"sig{i}"
        proc = tuner(run_args(out, 30))
        time.sleep(rng.uniform(0.05, 5.0))
        for sig in sigs:
            if proc.poll() is None:
                proc.send_signal(sig)
            time.sleep(rng.uniform(0.0, 0.05))
        _, err = proc.communicate(timeout=120)
        cases += 1
        codes.append(proc.returncode)
        # 130: stopped by autotune; -N: the signal came while Python itself was starting, before any code ran
        bad = proc.returncode not in (130, 0, -sigs[0]) or "Traceback" in err or len(err.strip().splitlines()) > 1
        bad_exit += bad
        if bad:
            print(f"    {name} after the delay: exit {proc.returncode}, stderr {err.strip()[-300:]!r}", flush=True)
        multiline += len(err.strip().splitlines()) > 1
        if (out / "autotune.db").exists():
            try:
                running_left += running(load(f"sqlite:///{out / 'autotune.db'}"))
            except Exception:  # noqa: BLE001 - stopped before the study existed
                pass
    # the baseline after an interrupted first trial: SIGINT during trial 0, then the same command again
    out = tmp / "sig-baseline"
    proc = tuner(run_args(out, 6))
    db = out / "autotune.db"
    while proc.poll() is None and not db.exists():
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.wait()
    rc = tuner(run_args(out, 6)).wait()
    tally.add("signals", cases=cases, exit_codes=sorted(set(codes)), exit_not_130=bad_exit, not_one_line=multiline, running_left=running_left,
              baseline_missing_after_resume=0 if rc == 0 and baseline_ok(out) else 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds (a minute or two)")
    p.add_argument("--postgres", default=os.environ.get("AUTOTUNE_TEST_POSTGRES_URL"),
                   help="PostgreSQL URL for the worker campaign (bash .ci/postgres.sh prints one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-claims", action="store_true",
                   help="workers without configuration claims and with duplicate model proposals, as before "
                        "issue 20 (for comparison; expected OFF TARGET)")
    p.add_argument("--only", choices=("kill9", "orphans", "workers", "signals"), action="append")
    args = p.parse_args()
    rng = random.Random(args.seed)
    if args.no_claims:
        os.environ["AUTOTUNE_FAULTS_NO_CLAIMS"] = "1"
    only = set(args.only or ("kill9", "orphans", "workers", "signals"))
    n = 4 if args.quick else 1
    tally = Tally()
    print(f"# benchmarks/faults.py  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  {platform.node()} "
          f"({os.cpu_count()} CPUs, {platform.python_version()}, optuna {optuna.__version__}), seed {args.seed}"
          + (", claims OFF" if args.no_claims else ""),
          flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="autotune-faults-") as d:
        tmp = Path(d)
        if "kill9" in only:
            kill9(tmp, rng, rounds=24 // n, trials=24, tally=tally)
        if "orphans" in only:
            orphans(tmp, rng, rounds=8 // n if n == 1 else 3, tally=tally)
        if "workers" in only:
            if args.postgres:
                workers(tmp, args.postgres, "postgresql", trials=60 // n, tally=tally)
            else:
                print("  workers-postgresql: skipped (no --postgres URL)")
            workers(tmp, f"journal:///{tmp / 'study.log'}", "journal", trials=60 // n, tally=tally)
        if "signals" in only:
            signals(tmp, rng, rounds=16 // n, tally=tally)
    ok = True
    for row in tally.rows:
        for key in ("lost", "duplicated", "running_left", "orphaned", "baseline_missing", "exit_not_130",
                    "not_one_line", "baseline_missing_after_resume"):
            ok &= row.get(key, 0) == 0
        ok &= row.get("repeated_pct", 0) <= 5.0
    total = sum(r.get(k, 0) for r in tally.rows for k in ("lost",))
    print(f"summary: lost {total}, duplicated {sum(r.get('duplicated', 0) for r in tally.rows)}, "
          f"RUNNING left {sum(r.get('running_left', 0) for r in tally.rows)}, "
          f"orphaned {sum(r.get('orphaned', 0) for r in tally.rows)}, "
          f"result.json without baseline {sum(r.get('baseline_missing', 0) + r.get('baseline_missing_after_resume', 0) for r in tally.rows)}, "
          "repeated probes " + ", ".join(f"{r['campaign'].split('-')[1]} {r['repeated_pct']}%"
                                         for r in tally.rows if "repeated_pct" in r)
          + f"; {time.monotonic() - started:.0f} s; {'OK' if ok else 'OFF TARGET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
