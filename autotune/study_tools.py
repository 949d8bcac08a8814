"""Commands that work on a stored study: `dashboard`, `report` and `worker`.

    autotune dashboard [--storage URL] [--out DIR] [--port P] [--host H]   # optuna-dashboard on the study
    autotune report [--study NAME] [--storage URL] --out DIR              # PNG figures + one HTML page
    autotune worker --study NAME --storage URL [--trials T] [--out DIR]   # join a running study

The CLI registers them with `add_commands(sub)` from `cli.build_parser`. Each handler returns an exit
code; bad input raises ConfigError/StorageError (one line, exit 2) before anything is written.
Storage URLs are SQLAlchemy URLs (`sqlite:///...`, `postgresql+psycopg://...`) or `journal:///path`
(Optuna's journal file, for a shared file system).
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from autotune.argtypes import nonempty_text, positive_int, seed_int, writable_folder
from autotune.errors import ConfigError

DEFAULT_OUT = "autotune-out"


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {value}")
    return value


def add_commands(subparsers) -> None:
    """Register `dashboard`, `report` and `worker` on the CLI's subparsers."""
    dash = subparsers.add_parser(
        "dashboard", help="serve optuna-dashboard on a stored study",
        description="Serves optuna-dashboard on the study storage, with the probe logs (OUT/artifacts) as artifacts.")
    dash.add_argument("--storage", type=nonempty_text, help="study storage URL (default: sqlite:///OUT/autotune.db)")
    dash.add_argument("--out", default=DEFAULT_OUT, help="the run's output folder (default ./autotune-out)")
    dash.add_argument("--port", type=_port, default=8080, help="port (default 8080)")
    dash.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    dash.set_defaults(func=cmd_dashboard)

    report = subparsers.add_parser(
        "report", help="write figures and an HTML report of a stored study",
        description="Writes OUT/report.html (figures embedded), OUT/figures/*.png and OUT/best.yaml.")
    report.add_argument("--study", type=nonempty_text, help="study name (default: the only study in the storage)")
    report.add_argument("--storage", type=nonempty_text, help="study storage URL (default: sqlite:///OUT/autotune.db)")
    report.add_argument("--out", default=DEFAULT_OUT,
                        help="the run's output folder, as in show/export: the study is read from OUT/autotune.db "
                             "unless --storage is given; the report is written there (default ./autotune-out)")
    report.set_defaults(func=cmd_report)

    worker = subparsers.add_parser(
        "worker", help="join a running study from another process or node",
        description="Runs trials of an existing study until it holds --trials finished trials. Model, GPUs, "
                    "backend and workload come from the study; give each worker its own --out (or a shared one).")
    worker.add_argument("--study", type=nonempty_text, required=True, help="the study to join")
    worker.add_argument("--storage", type=nonempty_text, required=True,
                        help="the study's storage URL (postgresql+psycopg://... or journal:///shared/path.log)")
    worker.add_argument("--trials", type=positive_int, default=40,
                        help="finished trials the study should hold, counting every worker's (default 40)")
    worker.add_argument("--out", default=DEFAULT_OUT, help="folder for probe runs and logs (default ./autotune-out)")
    worker.add_argument("--seed", type=seed_int, default=None, help="sampler seed (default none: workers must differ)")
    worker.add_argument("--config", type=Path,
                        help="the tune.yaml the study was started with (pinned knobs, narrowed ranges, probe steps)")
    worker.add_argument("--quiet", action="store_true", help="no per-trial lines")
    worker.set_defaults(func=cmd_worker)


# ---- shared: storage and study ---------------------------------------------------------------------------

def _existing_file_of(url: str) -> Path | None:
    """The file behind a file-based storage URL (SQLite, journal), None for a database server."""
    from sqlalchemy.engine import make_url

    from autotune.storage.journal import is_journal_url, journal_path
    from autotune.storage.urls import check_storage_url

    if is_journal_url(url):
        return journal_path(url)
    check_storage_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(parsed.database).expanduser()
    return None


def resolve_storage(storage: str | None, out: str) -> str:
    """--storage, or the run's default SQLite file in --out; a missing file is an error, never created."""
    from autotune.storage.urls import DB_FILENAME, default_storage_url

    if not storage:
        path = Path(out).expanduser() / DB_FILENAME
        if not path.is_file():
            raise ConfigError(f"no study database at {path}; run `autotune run` first or pass --storage")
        return default_storage_url(path.parent)
    path = _existing_file_of(storage)
    if path is not None and not path.is_file():
        raise ConfigError(f"no study database at {path}")
    return storage


def load_study(url: str, name: str | None):
    """The named study, or the only one; one-line errors for an empty storage or an unknown name."""
    import optuna

    from autotune.storage.urls import open_storage, redact

    storage = open_storage(url)
    names = optuna.get_all_study_names(storage)
    if not names:
        raise ConfigError(f"no studies in {redact(url)}; run `autotune run --storage ...` first")
    if name is not None and name not in names:
        raise ConfigError(f"no study {name!r} in {redact(url)}; studies: {', '.join(names)}")
    if name is None and len(names) > 1:
        raise ConfigError(f"{len(names)} studies in {redact(url)}; pick one with --study ({', '.join(names)})")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name or names[0], storage=storage)


# ---- dashboard -------------------------------------------------------------------------------------------

def placeholder_free(trial):
    """A stored trial as the dashboard should plot it: a rejected, OOM or inferred trial's placeholder value
    (0 tokens/s, rule 9 of CONVENTIONS.md) is no measurement, so it is shown as a FAIL trial with no value."""
    import copy

    from optuna.trial import TrialState

    if trial.state != TrialState.COMPLETE or trial.user_attrs.get("feasible") is not False:
        return trial
    shown = copy.copy(trial)
    shown.state = TrialState.FAIL
    shown.values = None
    return shown


def dashboard_storage(inner):
    """A view of the study storage for optuna-dashboard: every call goes to `inner`; trials are read through
    placeholder_free so the history and slice plots hold measurements only."""
    from optuna.storages import BaseStorage

    def forward(name):
        return lambda self, *args, **kwargs: getattr(inner, name)(*args, **kwargs)

    namespace = {name: forward(name) for name in BaseStorage.__abstractmethods__}
    def get_all_trials(self, study_id, deepcopy=True, states=None):
        shown = [placeholder_free(t) for t in inner.get_all_trials(study_id, deepcopy=deepcopy)]
        return shown if states is None else [t for t in shown if t.state in states]  # after the relabelling

    namespace["get_all_trials"] = get_all_trials
    namespace["get_trial"] = lambda self, trial_id: placeholder_free(inner.get_trial(trial_id))
    namespace["__getattr__"] = lambda self, name: getattr(inner, name)
    return type("DashboardStorageView", (BaseStorage,), namespace)()


def dashboard_app(storage, artifact_dir: Path):
    """optuna-dashboard's WSGI app on an opened study storage, with autotune's artifact store."""
    try:
        import optuna_dashboard
    except ImportError:
        from autotune.errors import install_hint

        raise ConfigError(f"autotune dashboard needs optuna-dashboard: {install_hint('dashboard')}") from None
    from optuna.artifacts import FileSystemArtifactStore

    if artifact_dir.parent.is_dir():  # the run's folder: probe logs land here (search/driver.py keeps them)
        try:
            artifact_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--out {artifact_dir.parent}: cannot create {artifact_dir} "
                              f"({exc.strerror or exc})") from None
    return optuna_dashboard.wsgi(storage, artifact_store=FileSystemArtifactStore(str(artifact_dir)))


def cmd_dashboard(args) -> int:
    import optuna
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from autotune.storage.urls import open_storage, redact

    url = resolve_storage(args.storage, args.out)
    storage = open_storage(url)
    names = optuna.get_all_study_names(storage)
    if not names:
        raise ConfigError(f"no studies in {redact(url)}; run `autotune run --storage ...` first")
    artifact_dir = Path(args.out).expanduser() / "artifacts"
    app = dashboard_app(dashboard_storage(storage), artifact_dir)

    class Server(ThreadingMixIn, WSGIServer):  # a browser loads several files at once
        daemon_threads = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args) -> None:  # one line per request would drown the URL line
            pass

    try:
        httpd = make_server(args.host, args.port, app, server_class=Server, handler_class=QuietHandler)
    except OSError as exc:
        raise ConfigError(f"--host {args.host} --port {args.port}: cannot listen ({exc.strerror or exc})") from None
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"optuna-dashboard for {len(names)} stud{'y' if len(names) == 1 else 'ies'} ({', '.join(names)}) "
          f"in {redact(url)}, artifacts in {artifact_dir}", flush=True)
    print(f"open http://{shown_host}:{httpd.server_port}/dashboard  (Ctrl-C to stop)", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        print("dashboard stopped")
    finally:
        httpd.server_close()
    return 0


# ---- report ----------------------------------------------------------------------------------------------

def cmd_report(args) -> int:
    from autotune.report import write_report

    url = resolve_storage(args.storage, args.out)
    out_dir = writable_folder(args.out)
    study = load_study(url, args.study)
    report = write_report(study, out_dir, storage_url=url)
    label = " (SIMULATED study)" if report.simulated else ""
    print(f"wrote {report.html}{label} with {len(report.figures)} figure(s) in {out_dir / 'figures'}")
    for name, why in report.skipped.items():
        print(f"  no {name} figure: {why}")
    if report.best_yaml_note:
        print(report.best_yaml_note)
    if report.best_yaml is None:
        print("no feasible configuration yet: nothing exported")
    else:
        print(f"best configuration: {report.best_yaml}  (launch: autotune train --config {report.best_yaml})")
    return 0


# ---- worker ----------------------------------------------------------------------------------------------

def worker_config(study, *, storage_url: str, trials: int, out_dir: Path, seed: int | None,
                  config: Path | None):
    """A TuneConfig rebuilt from the study's stored identity and search settings.

    Settings come from the study when the run stored them (storage/settings.py), else from --config
    (the tune.yaml the run used), else the defaults. A --config that contradicts the study is refused.
    """
    from dataclasses import replace

    from autotune.config import TuneConfig, load_tune_yaml
    from autotune.hardware import detect_host_mem_gib, get_gpu
    from autotune.models import model_from_identity
    from autotune.search.driver import build_space
    from autotune.storage.results import identity_of, workload_of
    from autotune.storage.settings import stored_settings
    from autotune.verl.logprob_path import takes_logprob_loop

    identity = identity_of(study)
    workload = workload_of(identity)
    tune = load_tune_yaml(config)
    if config is not None and tune.workload != workload:
        raise ConfigError(f"--config {config}: its workload differs from the one study {study.study_name!r} "
                          "was created for")
    given = {"fixed": tune.fixed, "ranges": tune.ranges, "tune_workload": tune.tune_workload, "probe": tune.probe,
             "search": tune.search}
    settings = stored_settings(study)
    if settings is None:
        settings = given
        objective = identity.get("objective", settings["search"].objective)
        if config is not None and settings["search"].objective != objective:
            raise ConfigError(f"--config {config}: search.objective {settings['search'].objective!r} but study "
                              f"{study.study_name!r} optimizes {objective!r}")
        margin = study.user_attrs.get("memory_margin_gib", settings["search"].memory_margin_gib)
        settings["search"] = replace(settings["search"], objective=objective, memory_margin_gib=margin)
    elif config is not None:
        diff = sorted(k for k in settings if settings[k] != given[k])
        if diff:
            raise ConfigError(f"--config {config} differs from study {study.study_name!r} in: {', '.join(diff)}; "
                              "leave --config out to use the study's own settings")
    cfg = TuneConfig(model=model_from_identity(identity), gpu=get_gpu(identity["gpu"]),
                     gpus_per_node=identity["gpus_per_node"], nodes=identity["nodes"], backend=identity["backend"],
                     trials=trials, storage_url=storage_url, study_name=study.study_name, out_dir=out_dir, seed=seed,
                     workload=workload, host_mem_gib=None if identity["backend"] == "sim" else detect_host_mem_gib(),
                     env=identity.get("env") or {},  # what the job's script exports: this worker's probes get it too
                     logprob_loop=takes_logprob_loop(identity["backend"], identity.get("env") or {}, probes_here=True),
                     **settings)  # a worker probes on its own machine: its own RAM bounds the offload
    build_space(cfg)  # the same validation `run` does for fixed/ranges/tune_workload
    return cfg


def _check_backend_here(cfg) -> None:
    from autotune.errors import BackendUnavailable
    from autotune.hardware import detect_gpus
    from autotune.backends.select import unavailable_reason

    if cfg.backend == "sim":
        return
    detected = detect_gpus()
    reason = unavailable_reason(cfg.backend, detected)
    if reason:
        raise BackendUnavailable(f"study {cfg.study_name!r} probes with the {cfg.backend} backend: {reason}")
    if cfg.nodes == 1 and cfg.gpus_per_node > detected.count:
        raise BackendUnavailable(f"study {cfg.study_name!r} needs {cfg.gpus_per_node} GPU(s) per node but this "
                                 f"machine has {detected.count}")


def cmd_worker(args) -> int:
    from autotune.config import check_study_name
    from autotune.backends.base import get_runner
    from autotune.progress import RunProgress
    from autotune.search.budget import finished_count
    from autotune.search.driver import run_study
    from autotune.storage.urls import redact

    check_study_name(args.study)
    url = resolve_storage(args.storage, args.out)
    out_dir = writable_folder(args.out)
    study = load_study(url, args.study)
    cfg = worker_config(study, storage_url=url, trials=args.trials, out_dir=out_dir, seed=args.seed,
                        config=args.config)
    _check_backend_here(cfg)
    runner = get_runner(cfg.backend)
    me = f"{socket.gethostname()}:{os.getpid()}"
    sim = " (SIMULATED by the calibrated model)" if runner.simulated else ""
    print(f"worker {me} joins study {cfg.study_name}{sim} in {redact(url)}: "
          f"{finished_count(study)}/{cfg.trials} finished", flush=True)
    ran = []
    with RunProgress(cfg.trials, study_name=cfg.study_name, simulated=runner.simulated,
                     warmup_steps=cfg.probe.warmup_steps, quiet=args.quiet) as progress:
        progress.preload(study.get_trials(deepcopy=False))

        def on_trial(t) -> None:
            ran.append(t.number)
            progress.on_trial(t)

        study = run_study(cfg, runner, on_trial=on_trial, on_step=progress.on_step)
    print(f"worker {me} ran {len(ran)} trial(s); study {cfg.study_name} holds {finished_count(study)} finished "
          f"trial(s)", flush=True)
    return 0


__all__ = ["add_commands", "cmd_dashboard", "cmd_report", "cmd_worker", "load_study",
           "resolve_storage", "worker_config"]
