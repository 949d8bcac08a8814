"""`autotune report`: figures and one self-contained HTML page; infeasible trials never plotted as results."""

import base64
import html
import os
import re
import subprocess
import sys
import warnings

import optuna
import pytest

from autotune.cli import main
from autotune.report import (NotPlotted, figure_gpu, figure_history, figure_pareto, figure_phases, study_view,
                             write_report)
from autotune.storage.records import TIE_FRACTION, best_records, is_result

STUDY = "qwen2.5-1.5b-1x8-sim"
POISON_TPS = 987654.0  # what an infeasible placeholder would show if it leaked into a figure or the page


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "out"
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-1.5b", "--gpus", "8",
                           "--backend", "sim", "--trials", "12", "--out", str(out), "--quiet", "--seed", "3"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    return out, f"sqlite:///{out / 'autotune.db'}"


def _copy(url, tmp_path, name="copy"):
    """A writable copy of the simulated study to add hand-made trials to."""
    to = f"sqlite:///{tmp_path / (name + '.db')}"
    optuna.copy_study(from_study_name=STUDY, from_storage=url, to_storage=to)
    return optuna.load_study(study_name=STUDY, storage=to), to


def _add_like(study, source, *, value, **attrs):
    """A trial with `source`'s configuration and the given outcome attributes."""
    user_attrs = {**source.user_attrs, **attrs}
    user_attrs.pop("baseline", None)
    constraints = {"rules": 0.0, "memory": 0.0}
    if attrs.get("feasible") is False:
        constraints["memory"] = 3.0
    study.add_trial(optuna.trial.create_trial(params=source.params, distributions=source.distributions,
                                              values=value if isinstance(value, list) else [value],
                                              user_attrs=user_attrs, constraints=constraints))
    return study.trials[-1]


def _poison(study, source):
    """Infeasible trials carrying a huge throughput: an OOM, a rule rejection, and a 'measured' one that
    violated a constraint."""
    return [
        _add_like(study, source, value=POISON_TPS, state="oom", feasible=False, tokens_per_s_per_gpu=POISON_TPS,
                  reason="CUDA out of memory"),
        _add_like(study, source, value=POISON_TPS, state="rejected", feasible=False, tokens_per_s_per_gpu=POISON_TPS,
                  reason="rule: nope"),
        _add_like(study, source, value=POISON_TPS, state="simulated", feasible=False,
                  tokens_per_s_per_gpu=POISON_TPS),
    ]


def _plotted_y(fig):
    ys = []
    for ax in fig.axes:
        for line in ax.get_lines():
            ys += [float(y) for y in line.get_ydata()]
        for coll in ax.collections:
            ys += [float(p[1]) for p in coll.get_offsets()]
        for patch in ax.patches:
            ys.append(float(patch.get_width()))
    return ys


def test_report_command_writes_a_self_contained_page(sim_run, tmp_path, capsys):
    out, url = sim_run
    rep = tmp_path / "rep"
    assert main(["report", "--storage", url, "--out", str(rep)]) == 0
    printed = capsys.readouterr().out
    assert "SIMULATED" in printed and "report.html" in printed
    page = (rep / "report.html").read_text()
    figures = sorted(p.name for p in (rep / "figures").iterdir())
    assert figures == ["history.png", "importances.png", "parallel.png", "phases.png"]  # no Pareto, no GPU samples
    for name in figures:
        assert (rep / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 4 and all(base64.b64decode(e)[:4] == b"\x89PNG" for e in embedded)
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page and "<script" not in page
    assert page.count("SIMULATED") >= 6  # banner, title, every figure caption
    best_yaml = (rep / "best.yaml").read_text()
    assert html.escape(best_yaml) in page and "simulated: true" in best_yaml
    assert f"autotune train --config {rep / 'best.yaml'}" in page
    assert f"python3 -m verl.trainer.main_ppo --config-path={rep} --config-name=best" in page
    study = optuna.load_study(study_name=STUDY, storage=url)
    best = best_records(study, k=1)[0]  # the exported one: the fastest, or the tie-break among those within 1%
    fastest = max(t.user_attrs["tokens_per_s_per_gpu"] for t in study.trials if is_result(t))
    assert best.tokens_per_s_per_gpu >= fastest * (1 - TIE_FRACTION)
    assert f"study: {STUDY}, trial {best.number};" in best_yaml


def test_report_defaults_to_the_run_folder(sim_run, tmp_path, capsys):
    out, _ = sim_run
    assert main(["report", "--out", str(out)]) == 0
    assert (out / "report.html").is_file() and (out / "figures" / "history.png").is_file()


def test_infeasible_trials_are_never_plotted_or_reported(sim_run, tmp_path):
    _, url = sim_run
    study, to = _copy(url, tmp_path)
    base = next(t for t in study.trials if t.user_attrs.get("baseline"))
    poison = {t.number for t in _poison(study, base)}
    view = study_view(study)
    assert poison.isdisjoint(t.number for t in view.results) and poison.isdisjoint(t.number for t in view.best)
    for build in (figure_history, figure_phases):
        ys = _plotted_y(build(view))
        assert ys and max(ys) < POISON_TPS
    phase_labels = [t.get_text() for t in figure_phases(view).axes[0].get_yticklabels()]
    assert not any(f"trial {n} " in label for n in poison for label in phase_labels)
    report = write_report(study, tmp_path / "rep", storage_url=to)
    page = report.html.read_text()
    assert "987654" not in page
    assert "oom</td><td>CUDA out of memory" in page  # listed as a trial without a result, with its reason


def test_no_feasible_result_still_writes_a_page(sim_run, tmp_path):
    _, url = sim_run
    to = f"sqlite:///{tmp_path / 'empty.db'}"
    src = optuna.load_study(study_name=STUDY, storage=url)
    study = optuna.create_study(study_name="nothing-fits", storage=to, direction="maximize")
    study.set_user_attr("identity", src.user_attrs["identity"])
    base = next(t for t in src.trials if t.user_attrs.get("baseline"))
    _poison(study, base)
    report = write_report(study, tmp_path / "rep", storage_url=to)
    assert report.best_yaml is None and not (tmp_path / "rep" / "best.yaml").exists()
    assert report.figures == {} and "history" in report.skipped
    assert "No feasible configuration yet" in report.html.read_text()


def test_gpu_utilization_figure_from_the_best_measured_probe(sim_run, tmp_path):
    _, url = sim_run
    study, to = _copy(url, tmp_path)
    best = study_view(study).best[0]
    samples = {"0": {"t_s": [0.0, 1.0, 2.0], "util_pct": [10.0, 95.0, 40.0], "mem_used_gib": [20.0, 70.0, 71.0]},
               "1": {"t_s": [0.0, 1.0, 2.0], "util_pct": [12.0, 91.0, 42.0], "mem_used_gib": [21.0, 69.0, 70.0]}}
    decoy = {"0": {"t_s": [0.0, 1.0], "util_pct": [1.0, 1.0], "mem_used_gib": [1.0, 1.0]}}
    _add_like(study, best, value=POISON_TPS, state="oom", feasible=False, tokens_per_s_per_gpu=POISON_TPS,
              gpu_samples=decoy)  # an infeasible trial with samples must never be chosen
    measured = _add_like(study, best, value=best.value * 1.01, state="measured", simulated=False, feasible=True,
                         tokens_per_s_per_gpu=best.value * 1.01, gpu_samples=samples)
    view = study_view(study)
    fig = figure_gpu(view)
    util_ax, mem_ax = fig.axes
    assert f"trial {measured.number}" in fig.get_suptitle()
    assert [list(line.get_ydata()) for line in util_ax.get_lines()] == [[10.0, 95.0, 40.0], [12.0, 91.0, 42.0]]
    assert [list(line.get_ydata()) for line in mem_ax.get_lines()][0] == [20.0, 70.0, 71.0]
    report = write_report(study, tmp_path / "rep", storage_url=to)
    assert "gpu" in report.figures and 'id="fig-gpu"' in report.html.read_text()


def test_simulated_study_has_no_gpu_figure(sim_run):
    _, url = sim_run
    view = study_view(optuna.load_study(study_name=STUDY, storage=url))
    assert view.simulated
    with pytest.raises(NotPlotted, match="simulated"):
        figure_gpu(view)
    with pytest.raises(NotPlotted, match="single-objective"):
        figure_pareto(view)


def test_pareto_front_of_a_multi_objective_study(sim_run, tmp_path):
    _, url = sim_run
    src = optuna.load_study(study_name=STUDY, storage=url)
    to = f"sqlite:///{tmp_path / 'mo.db'}"
    study = optuna.create_study(study_name="mo", storage=to, directions=["maximize", "minimize"])
    study.set_user_attr("identity", src.user_attrs["identity"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["tokens_per_s_per_gpu", "peak_mem_gib"])
    results = [t for t in src.trials if is_result(t)]
    for t in results:
        _add_like(study, t, value=[t.value, t.user_attrs["peak_mem_gib"]], feasible=True)
    _add_like(study, results[0], value=[POISON_TPS, 1.0], state="oom", feasible=False, tokens_per_s_per_gpu=POISON_TPS)
    view = study_view(study)
    assert view.multi_objective and len(view.results) == len(results)
    fig = figure_pareto(view)
    assert max(float(x) for ax in fig.axes for line in ax.get_lines() for x in line.get_xdata()) < POISON_TPS
    assert "tokens_per_s_per_gpu (maximize)" == fig.axes[0].get_xlabel()
    report = write_report(study, tmp_path / "rep", storage_url=to)
    assert "pareto" in report.figures


@pytest.mark.parametrize("argv, message", [
    (["report", "--storage", "URL", "--study", "nope", "--out", "OUT"], "no study 'nope' in"),
    (["report", "--storage", "EMPTY", "--out", "OUT"], "no studies in"),
    (["report", "--out", "NODB"], "no study database at"),
    (["report", "--storage", "URL", "--out", "FILE/sub"], "not a writable folder"),
    (["report", "--storage", "sqlite:///NODIR/x.db", "--out", "OUT"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(sim_run, tmp_path, capsys, argv, message):
    _, url = sim_run
    empty = tmp_path / "empty.db"
    optuna.storages.RDBStorage(f"sqlite:///{empty}")  # tables, no study
    (tmp_path / "file").write_text("x")
    subst = {"URL": url, "EMPTY": f"sqlite:///{empty}", "OUT": str(tmp_path / "o"), "NODB": str(tmp_path / "nodb"),
             "FILE": str(tmp_path / "file"), "NODIR": str(tmp_path / "nodir")}
    argv = [re.sub("|".join(subst), lambda m: subst[m.group(0)], a) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: ") and message in err and err.count("\n") == 1


def test_report_keeps_a_hand_edited_best_yaml_and_export_sets_it_aside(sim_run, tmp_path, capsys):
    """Issue 32 item 2: `report` never overwrites a best.yaml autotune did not write; `export` keeps it beside."""
    _, url = sim_run
    rep = tmp_path / "rep"
    assert main(["report", "--storage", url, "--out", str(rep)]) == 0
    capsys.readouterr()
    ours = (rep / "best.yaml").read_text()
    assert main(["report", "--storage", url, "--out", str(rep)]) == 0  # autotune's own file: rewritten freely
    assert "edited" not in capsys.readouterr().out
    edited = ours.replace("trainer:\n", "trainer:\n  total_epochs: 3\n", 1)
    assert edited != ours
    (rep / "best.yaml").write_text(edited)
    assert main(["report", "--storage", url, "--out", str(rep)]) == 0
    printed = capsys.readouterr().out
    assert (rep / "best.yaml").read_text() == edited
    assert sum("it was edited after autotune wrote it" in line for line in printed.splitlines()) == 1
    assert html.escape(edited) in (rep / "report.html").read_text()
    assert main(["export", "--storage", url, "--out", str(rep)]) == 0
    printed = capsys.readouterr().out
    assert (rep / "best.edited.yaml").read_text() == edited and f"kept as {rep / 'best.edited.yaml'}" in printed
    assert "autotune-sha256" in (rep / "best.yaml").read_text().splitlines()[0]
