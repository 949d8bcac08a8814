"""`autotune report`: PNG figures (matplotlib) and one self-contained HTML page for a stored study.

Only real results are plotted: COMPLETE trials whose outcome is a measurement (or a simulation) and
that are feasible. Rejected and OOM trials are COMPLETE too, with a placeholder value of 0 and a
violated constraint so the sampler learns from them (records.py); they are counted and their reasons
listed, never drawn as results. A study of the `sim` backend is labelled SIMULATED on every figure
and at the top of the page.

The figure functions take a `StudyView` and return a matplotlib Figure (or raise NotPlotted with the
reason), so notebooks/analysis.ipynb shows the same figures inline.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import ConfigError
from autotune.storage.records import TrialRecord, is_result

# verl's timing_s/* phases in the order they run inside one GRPO step (reference/verl.md).
PHASE_ORDER = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")
PHASE_LABELS = {"gen": "rollout generate (vLLM)", "old_log_prob": "old log-prob", "ref": "reference log-prob",
                "update_actor": "actor update", "update_weights": "weight sync to rollout"}
SIMULATED_STAMP = "SIMULATED by the calibrated model, not measured"
FIGURE_NAMES = ("history", "importances", "parallel", "pareto", "phases", "gpu")
MAX_PARALLEL_PARAMS = 8


class NotPlotted(Exception):
    """A figure that has nothing honest to show; the message says why (shown on the page)."""


def reason_kind(reason: str) -> str:
    """A reason without its particulars, to count alike trials together ("rule_id: message" -> "rule_id")."""
    return re.split(r":| \(", reason, maxsplit=1)[0].strip()[:120]


def tokens_per_s(t: FrozenTrial) -> float:
    return float(t.user_attrs["tokens_per_s_per_gpu"])


@dataclass(frozen=True, kw_only=True)
class StudyView:
    """Everything the report reads from a study, computed once."""

    study_name: str
    identity: dict
    simulated: bool
    directions: tuple[str, ...]
    metric_names: tuple[str, ...]
    trials: tuple[FrozenTrial, ...]
    results: tuple[FrozenTrial, ...]  # feasible results, by trial number
    best: tuple[FrozenTrial, ...]  # feasible results the exporter ranks, fastest first
    baseline: FrozenTrial | None  # verl's default configuration when it gave a result
    pareto: frozenset[int] = frozenset()  # multi-objective: numbers of the results on the Pareto front
    outcomes: Counter = field(default_factory=Counter)  # autotune state -> count, over all finished trials

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1

    @property
    def speedup(self) -> float | None:
        if not self.best or self.baseline is None or not tokens_per_s(self.baseline):
            return None
        return tokens_per_s(self.best[0]) / tokens_per_s(self.baseline)

    @property
    def not_plotted(self) -> int:
        return sum(t.state.is_finished() and not is_result(t) for t in self.trials)


def study_view(study: optuna.Study) -> StudyView:
    from autotune.storage.records import best_records, pareto_front
    from autotune.storage.results import identity_of

    identity = identity_of(study)
    trials = tuple(study.get_trials(deepcopy=False))
    results = tuple(t for t in trials if is_result(t))
    # the exporter's ranking (multi-objective: the Pareto front within the memory margin), so the page's first best is
    # the trial best.yaml comes from; a configuration probed again (a confirmation) brings its other trials right
    # after its first
    ranked = [[r.number] + [p["trial"] for p in r.user_attrs.get("repeats") or () if p["trial"] != r.number]
              for r in best_records(study, k=len(trials))]
    best = tuple(trials[n] for numbers in ranked for n in numbers if is_result(trials[n]))
    baseline = next((t for t in results if t.user_attrs.get("baseline")), None)
    simulated = identity.get("backend") == "sim" or any(t.user_attrs.get("simulated") for t in results)
    names = tuple(study.metric_names or ())
    directions = tuple(d.name.lower() for d in study.directions)
    outcomes = Counter(TrialRecord.of(t).state for t in trials if t.state.is_finished())
    return StudyView(study_name=study.study_name, identity=identity, simulated=simulated, directions=directions,
                     metric_names=names if len(names) == len(directions) else (), trials=trials, results=results,
                     best=best, baseline=baseline, outcomes=outcomes,
                     pareto=frozenset(r.number for r in pareto_front(study)) if len(directions) == 2 else frozenset())


# ---- figures -------------------------------------------------------------------------------------------

def _figure(view: StudyView, title: str, *, figsize=(9.0, 5.0), nrows: int = 1):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("autotune report needs matplotlib (a dependency of verl-autotune): pip install matplotlib") from None
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, 1, squeeze=False)[:, 0]
    if view.simulated:  # on the image itself, so a figure copied into a slide keeps the label
        fig.suptitle(f"{title}: {view.study_name}\n{SIMULATED_STAMP}", fontsize=11, color="crimson")
    else:
        fig.suptitle(f"{title}: {view.study_name}", fontsize=11)
    return fig, (axes if nrows > 1 else axes[0])


def figure_history(view: StudyView):
    """tokens/s/GPU of every result by trial number, the best so far, and verl's default."""
    if not view.results:
        raise NotPlotted("no feasible result yet")
    fig, ax = _figure(view, "Optimization history")
    from matplotlib.ticker import MaxNLocator

    xs = [t.number for t in view.results]
    ys = [tokens_per_s(t) for t in view.results]
    ax.scatter(xs, ys, s=22, color="tab:blue", label="feasible result", zorder=3)
    best_so_far, running = [], -math.inf
    for y in ys:
        running = max(running, y)
        best_so_far.append(running)
    ax.step(xs, best_so_far, where="post", color="tab:green", label="best so far")
    if view.baseline is not None:
        ax.axhline(tokens_per_s(view.baseline), color="tab:gray", linestyle="--",
                   label=f"verl default (trial {view.baseline.number})")
    ax.set_xlabel("trial number")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("tokens/s per GPU")
    ax.set_ylim(bottom=0)
    if view.not_plotted:
        ax.text(0.01, 0.01, f"{view.not_plotted} trial(s) without a result (rejected, OOM, pruned, failed) "
                "are not plotted", transform=ax.transAxes, fontsize=8, color="dimgray")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def param_importances(view: StudyView) -> dict[str, float]:
    """Optuna's default evaluator over feasible results only (never the placeholders of infeasible trials)."""
    if len(view.results) < 3:
        raise NotPlotted(f"needs at least 3 feasible results, the study has {len(view.results)}")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        shadow = optuna.create_study(directions=list(view.directions))
    finally:
        optuna.logging.set_verbosity(verbosity)
    for t in view.results:
        shadow.add_trial(optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                   values=[tokens_per_s(t)] + list(t.values[1:])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            importances = optuna.importance.get_param_importances(
                shadow, target=(lambda t: t.values[0]) if view.multi_objective else None)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            raise NotPlotted(f"importances could not be computed: {str(exc).splitlines()[0]}") from None
    if not importances:
        raise NotPlotted("no parameter is shared by all feasible results and varies between them")
    return dict(importances)


def figure_importances(view: StudyView, importances: dict[str, float] | None = None):
    importances = importances if importances is not None else param_importances(view)
    top = list(importances.items())[:15][::-1]
    fig, ax = _figure(view, "Parameter importance for tokens/s per GPU", figsize=(9.0, 0.35 * len(top) + 1.6))
    ax.barh([k for k, _ in top], [v for _, v in top], color="tab:blue")
    ax.set_xlabel(f"importance (Optuna default evaluator, {len(view.results)} feasible results)")
    return fig


def _axis_values(values: list) -> tuple[list[float], list[tuple[float, str]]]:
    """Map one parameter's values to [0, 1] and give tick positions with labels."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    uniq = sorted(set(values), key=lambda v: (str(type(v)), v))
    if not numeric:
        pos = {v: (i / (len(uniq) - 1) if len(uniq) > 1 else 0.5) for i, v in enumerate(uniq)}
        return [pos[v] for v in values], [(pos[v], str(v)) for v in uniq]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    ticks, last = [], -1.0
    for v in (uniq if len(uniq) <= 6 else [lo, lo + span / 2, hi]):
        y = (v - lo) / span
        if y - last >= 0.06 or v == hi:  # labels closer than this overlap; keep the extremes
            if ticks and y - ticks[-1][0] < 0.06:
                ticks.pop()
            ticks.append((y, f"{v:.0f}" if abs(v) >= 100 else f"{v:g}"))
            last = y
    return [(v - lo) / span for v in values], ticks


def figure_parallel(view: StudyView, importances: dict[str, float] | None = None):
    """One line per feasible result across the parameters that vary, coloured by tokens/s per GPU."""
    if len(view.results) < 2:
        raise NotPlotted(f"needs at least 2 feasible results, the study has {len(view.results)}")
    shared = set.intersection(*(set(t.params) for t in view.results))
    varying = [p for p in shared if len({repr(t.params[p]) for t in view.results}) > 1]
    if not varying:
        raise NotPlotted("no parameter is shared by all feasible results and varies between them")
    ranked = [p for p in (importances or {}) if p in varying]
    order = ranked + sorted(p for p in varying if p not in ranked)
    params = order[:MAX_PARALLEL_PARAMS]
    scores = [tokens_per_s(t) for t in view.results]
    columns = [_axis_values(scores)] + [_axis_values([t.params[p] for t in view.results]) for p in params]
    names = ["tokens/s/GPU"] + params
    fig, ax = _figure(view, "Parallel coordinates of feasible results", figsize=(max(9.0, 1.5 * len(names)), 5.5))
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    lo, hi = min(scores), max(scores)
    best_index = view.results.index(view.best[0]) if view.best else scores.index(hi)
    for i, score in enumerate(scores):
        ys = [col[0][i] for col in columns]
        is_best = i == best_index
        ax.plot(range(len(names)), ys, color="crimson" if is_best else cmap((score - lo) / ((hi - lo) or 1.0)),
                linewidth=2.5 if is_best else 1.0, alpha=1.0 if is_best else 0.7, zorder=3 if is_best else 2)
    for x, (_, ticks) in enumerate(columns):
        ax.axvline(x, color="black", linewidth=0.8)
        for y, label in ticks:
            ax.text(x + 0.03, y, label, fontsize=7, va="center")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_yticks([])
    ax.set_xlim(-0.2, len(names) - 0.5)
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"best: trial {view.results[best_index].number} (red); others coloured by tokens/s/GPU, dark = slow",
                 fontsize=9)
    return fig


def figure_pareto(view: StudyView):
    if not view.multi_objective:
        raise NotPlotted("single-objective study (tokens/s per GPU only)")
    if not view.results:
        raise NotPlotted("no feasible result yet")
    names = view.metric_names or tuple(f"objective {i}" for i in range(len(view.directions)))
    points = [tuple(t.values[:2]) for t in view.results]
    front = {i for i, t in enumerate(view.results) if t.number in view.pareto}
    fig, ax = _figure(view, "Pareto front of feasible results")
    others = [p for i, p in enumerate(points) if i not in front]
    if others:
        ax.scatter(*zip(*others), s=20, color="tab:gray", alpha=0.6, label="dominated")
    on_front = sorted(p for i, p in enumerate(points) if i in front)
    ax.plot(*zip(*on_front), marker="o", color="tab:red", label="Pareto front")
    ax.set_xlabel(f"{names[0]} ({view.directions[0]})")
    ax.set_ylabel(f"{names[1]} ({view.directions[1]})")
    ax.legend(fontsize=8)
    return fig


def figure_phases(view: StudyView, k: int = 3):
    """Seconds per GRPO phase in one step: verl's default against the k fastest configurations."""
    rows = [t for t in view.best if t.user_attrs.get("phase_s")][:k]
    if view.baseline is not None and view.baseline.user_attrs.get("phase_s") and view.baseline not in rows:
        rows.append(view.baseline)
    if not rows:
        raise NotPlotted("no feasible result has a per-phase time breakdown (user attribute phase_s)")
    phases = [p for p in PHASE_ORDER if any(p in t.user_attrs["phase_s"] for t in rows)]
    phases += sorted({p for t in rows for p in t.user_attrs["phase_s"]} - set(phases))
    fig, ax = _figure(view, "Time per GRPO phase in one step", figsize=(10.0, 0.7 * len(rows) + 2.2))
    base_tps = tokens_per_s(view.baseline) if view.baseline is not None else None
    labels = []
    for t in rows:
        tag = "verl default" if t.user_attrs.get("baseline") else (
            f"x{tokens_per_s(t) / base_tps:.2f}" if base_tps else f"{tokens_per_s(t):.0f} tok/s/GPU")
        labels.append(f"trial {t.number} ({tag})")
    labels, rows = labels[::-1], rows[::-1]  # fastest on top
    left = [0.0] * len(rows)
    colors = colormaps_tab10()
    for i, phase in enumerate(phases):
        widths = [float(t.user_attrs["phase_s"].get(phase, 0.0)) for t in rows]
        ax.barh(labels, widths, left=left, color=colors[i % len(colors)], label=PHASE_LABELS.get(phase, phase))
        left = [a + b for a, b in zip(left, widths)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.1f} s", va="center", fontsize=8)
    ax.set_xlim(0, max(left) * 1.15)
    ax.set_xlabel("seconds per training step (sum of phases)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=min(len(phases), 5), frameon=False)
    if view.baseline is None:
        ax.set_title("verl's default configuration gave no result, so no baseline bar", fontsize=9)
    return fig


def colormaps_tab10() -> list:
    from matplotlib import colormaps

    return list(colormaps["tab10"].colors)


def figure_gpu(view: StudyView):
    """GPU utilization and memory over the probe of the fastest result where NVML samples were taken."""
    measured = next((t for t in view.best if t.user_attrs.get("gpu_samples")), None)
    if measured is None:
        why = "simulated study: no GPU was sampled" if view.simulated else "no feasible result has GPU samples"
        raise NotPlotted(why)
    samples = measured.user_attrs["gpu_samples"]
    fig, (util_ax, mem_ax) = _figure(view, f"GPU utilization during the probe of trial {measured.number}",
                                     figsize=(10.0, 6.0), nrows=2)
    for gpu in sorted(samples, key=lambda g: int(g)):
        series = samples[gpu]
        util_ax.plot(series["t_s"], series["util_pct"], linewidth=0.9, label=f"GPU {gpu}")
        if series.get("mem_used_gib"):
            mem_ax.plot(series["t_s"], series["mem_used_gib"], linewidth=0.9, label=f"GPU {gpu}")
    util_ax.set_ylabel("utilization %")
    util_ax.set_ylim(0, 105)
    mem_ax.set_ylabel("memory used GiB")
    mem_ax.set_xlabel("seconds since the probe started")
    util_ax.legend(fontsize=7, ncol=min(len(samples), 8), loc="lower right")
    return fig


# ---- the report -------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Report:
    html: Path
    figures: dict[str, Path]  # name -> PNG
    skipped: dict[str, str]  # name -> why it was not drawn
    best_yaml: Path | None
    simulated: bool
    best_yaml_note: str | None = None  # a hand-edited best.yaml kept as it is


def build_figures(view: StudyView) -> tuple[dict, dict[str, str]]:
    """name -> (caption, Figure) for what could be drawn, and name -> reason for the rest."""
    made, skipped = {}, {}
    try:
        importances = param_importances(view)
    except NotPlotted as exc:
        importances, skipped["importances"] = None, str(exc)
    builders = {
        "history": ("Optimization history: tokens/s per GPU of each feasible result", lambda: figure_history(view)),
        "importances": ("Which knobs mattered (feasible results only)",
                        lambda: figure_importances(view, importances)),
        "parallel": ("Parallel coordinates of feasible results", lambda: figure_parallel(view, importances)),
        "pareto": ("Pareto front", lambda: figure_pareto(view)),
        "phases": ("Time per GRPO phase: the fastest configurations against verl's default",
                   lambda: figure_phases(view)),
        "gpu": ("GPU utilization and memory over the fastest measured probe", lambda: figure_gpu(view)),
    }
    for name in FIGURE_NAMES:
        if name in skipped:
            continue
        caption, build = builders[name]
        try:
            fig = build()
        except NotPlotted as exc:
            skipped[name] = str(exc)
            continue
        made[name] = (caption, fig)
    return made, skipped


def write_report(study: optuna.Study, out_dir: Path, *, storage_url: str) -> Report:
    """OUT/best.yaml (the exporter's), OUT/figures/*.png and OUT/report.html (images embedded)."""
    from autotune.storage.results import export_best

    out_dir = Path(out_dir)
    view = study_view(study)
    figures_dir = out_dir / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    made, skipped = build_figures(view)
    pngs: dict[str, bytes] = {}
    for name in FIGURE_NAMES:
        path = figures_dir / f"{name}.png"
        if name not in made:
            path.unlink(missing_ok=True)  # never leave a stale figure from an earlier report beside this one
            continue
        buf = io.BytesIO()
        made[name][1].savefig(buf, format="png", dpi=110)
        pngs[name] = buf.getvalue()
        path.write_bytes(pngs[name])
    # a best.yaml edited by hand is the user's: the report never overwrites it (storage/results.py export_best)
    exported = export_best(study, out_dir, keep_edited=True) if view.best else None
    best_yaml = exported.path if exported else None
    note = exported.note if exported else None
    page = render_html(view, storage_url=storage_url, figures={n: (made[n][0], pngs[n]) for n in pngs},
                       skipped=skipped, best_yaml=best_yaml, best_yaml_note=note)
    html_path = out_dir / "report.html"
    tmp = html_path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(html_path)
    return Report(html=html_path, figures={n: figures_dir / f"{n}.png" for n in pngs}, skipped=skipped,
                  best_yaml=best_yaml, simulated=view.simulated, best_yaml_note=note)


# ---- HTML ---------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
.simulated{background:#fde8e8;border:2px solid #c0392b;color:#922;padding:.6em 1em;font-weight:bold}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f4f4f4}pre{background:#f7f7f7;border:1px solid #ddd;padding:.8em;overflow-x:auto;font-size:.85em}
figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}figcaption{font-size:.9em;color:#555}
.muted{color:#666;font-size:.9em}
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _table(header: list[str] | None, rows: list[list]) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render_html(view: StudyView, *, storage_url: str, figures: dict[str, tuple[str, bytes]],
                skipped: dict[str, str], best_yaml: Path | None, best_yaml_note: str | None = None) -> str:
    from autotune.backends.verl.runner import train_command
    from autotune.storage.urls import redact
    from autotune.ui import candidate_summary

    ident = view.identity
    title = f"autotune report: {view.study_name}" + (" (SIMULATED)" if view.simulated else "")
    parts = [f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{_e(title)}</h1>"]
    if view.simulated:
        parts.append("<p class=\"simulated\">SIMULATED: every number and figure on this page comes from autotune's "
                     "calibrated model (the sim backend), not from a measurement on GPUs.</p>")
    finished = sum(view.outcomes.values())
    facts = [
        ["model", ident.get("model")],
        ["GPUs", f"{ident.get('nodes')} node(s) x {ident.get('gpus_per_node')} {ident.get('gpu')}"],
        ["backend", ident.get("backend") + (" (simulated)" if view.simulated else "")],
        ["storage", redact(storage_url)],
        ["trials finished", finished],
        ["feasible results", len(view.results)],
        ["without a result", ", ".join(f"{k} {v}" for k, v in sorted(view.outcomes.items())
                                        if k not in ("measured", "simulated")) or "none"],
        ["verl default (baseline)", f"{tokens_per_s(view.baseline):.0f} tokens/s/GPU (trial {view.baseline.number})"
         if view.baseline is not None else "no result"],
        ["best", f"{tokens_per_s(view.best[0]):.0f} tokens/s/GPU (trial {view.best[0].number})"
         if view.best else "no feasible result yet"],
        ["speedup vs verl default", f"x{view.speedup:.2f}" if view.speedup else "n/a"],
    ]
    parts.append(_table(None, facts))

    parts.append("<h2>Best configuration</h2>")
    if best_yaml is None:
        parts.append("<p>No feasible configuration yet: nothing exported.</p>")
    else:
        if best_yaml_note:
            parts.append(f"<p>Trial {view.best[0].number} is the best" + (" (SIMULATED score)" if view.simulated
                                                                          else "") + f"; {_e(best_yaml_note)}:</p>")
        else:
            parts.append(f"<p>Trial {view.best[0].number}, written to <code>{_e(best_yaml)}</code>"
                         + (" (SIMULATED score)" if view.simulated else "") + ":</p>")
        parts.append(f"<pre>{_e(best_yaml.read_text(encoding='utf-8', errors='replace'))}</pre>")
        if view.baseline is not None:  # each knob it changed and the phases that moved (storage/changes.py)
            from autotune.storage.changes import changes_doc, describe_changes
            from autotune.storage.results import trial_doc

            changed = describe_changes(changes_doc(trial_doc(TrialRecord.of(view.baseline)),
                                                   trial_doc(TrialRecord.of(view.best[0]))), "the baseline")
            if changed:
                parts.append(f"<p>What it changed: {_e(changed)}.</p>")
        parts.append("<h2>How to launch it</h2>")
        verl = " ".join(["python3"] + train_command(best_yaml, [], python="python3")[1:])
        parts.append(f"<pre>autotune train --config {_e(best_yaml)}\n\n"
                     f"# or the same run with verl directly:\n{_e(verl)}</pre>")
        parts.append("<p class=\"muted\">Extra Hydra overrides go at the end, e.g. "
                     "<code>trainer.total_epochs=3</code>. The workload (batch sizes, rollout.n, lengths) is "
                     "the one the study was run for.</p>")

    parts.append("<h2>Fastest trials</h2>")
    rows = list(view.best[:5])
    if view.baseline is not None and view.baseline not in rows:
        rows.append(view.baseline)
    base_tps = tokens_per_s(view.baseline) if view.baseline is not None else None
    parts.append(_table(
        ["trial", "tokens/s/GPU", "vs verl default", "actor MFU", "peak GiB", "configuration"],
        [[f"{t.number}" + (" (verl default)" if t.user_attrs.get("baseline") else ""), f"{tokens_per_s(t):.0f}",
          f"x{tokens_per_s(t) / base_tps:.2f}" if base_tps else "n/a", _fmt(t.user_attrs.get("mfu"), ".3f"),
          _fmt(t.user_attrs.get("peak_mem_gib"), ".1f"), candidate_summary(t.user_attrs.get("candidate", {}))]
         for t in rows]) if rows else "<p>No feasible result yet.</p>")

    parts.append("<h2>Figures</h2>")
    for name, (caption, png) in figures.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure id=\"fig-{name}\"><img alt=\"{_e(caption)}\" src=\"data:image/png;base64,{data}\">"
                     f"<figcaption>{_e(caption)}" + (" (SIMULATED)" if view.simulated else "")
                     + "</figcaption></figure>")
    if skipped:
        parts.append(_table(["figure not drawn", "why"], [[n, r] for n, r in skipped.items()]))

    failed = [t for t in view.trials if t.state.is_finished() and not is_result(t)]
    parts.append("<h2>Trials without a result</h2>")
    if not failed:
        parts.append("<p>None.</p>")
    else:
        parts.append("<p class=\"muted\">Rejected by verl's rules, out of memory, pruned or failed. They teach the "
                     "sampler but are never plotted as results.</p>")
        reasons = Counter((TrialRecord.of(t).state, reason_kind(TrialRecord.of(t).reason)) for t in failed)
        parts.append(_table(["outcome", "reason", "trials"],
                            [[state, reason, n] for (state, reason), n in reasons.most_common(15)]))
    parts.append("</body></html>\n")
    return "\n".join(parts)
