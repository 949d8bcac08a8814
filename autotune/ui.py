"""What people read in the terminal: per-trial lines and tables (rich)."""

from __future__ import annotations

import optuna
from rich.console import Console
from rich.table import Table

from autotune.models import MODELS
from autotune.verl.stages import describe_stages
from autotune.storage.changes import changes_doc, describe_changes
from autotune.storage.results import lengths_line, trial_doc
from autotune.storage.tuning_cost import launch_of
from autotune.storage.node_profile import PROFILE_ATTR, describe_summary
from autotune.storage.records import (TrialRecord, baseline_label, baseline_record, best_records, probe_role,
                                      records, verl_default_record)

_console = Console(highlight=False)
if not _console.is_terminal:  # pipes and CI logs: wide enough for the configuration column
    _console = Console(highlight=False, width=200)


def candidate_summary(c: dict) -> str:
    """The knobs that matter at a glance, in verl's words."""
    if not c:
        return ""
    if c.get("actor_engine") == "megatron":
        layout = f"megatron tp{c['actor_tp']} pp{c['actor_pp']}" + (f" vpp{c['actor_vpp']}" if c["actor_vpp"] > 1 else "") \
            + (f" cp{c['actor_cp']}" if c["actor_cp"] > 1 else "") + (f" ep{c['actor_ep']}" if c["actor_ep"] > 1 else "")
    else:
        layout = c.get("actor_engine", "?") + (f" sp{c['ulysses_sp']}" if c.get("ulysses_sp", 1) > 1 else "")
    if c.get("use_dynamic_bsz"):
        batch = f"dyn {c['ppo_max_token_len_per_gpu']}/{c['log_prob_max_token_len_per_gpu']} tok"
    else:
        # the reference's own micro-batch too: two trials that differed only there printed alike (issue 32 item 4)
        batch = (f"micro {c['ppo_micro_batch_size_per_gpu']}/{c['log_prob_micro_batch_size_per_gpu']}"
                 + (f"/{c['ref_log_prob_micro_batch_size_per_gpu']}" if "ref_log_prob_micro_batch_size_per_gpu" in c
                    else ""))
    saves = [name for key, name in (("gradient_checkpointing", "ckpt"), ("param_offload", "p-off"),
                                    ("optimizer_offload", "o-off"), ("activation_offload", "a-off"),
                                    ("ref_param_offload", "ref-off"), ("use_liger", "liger"),
                                    ("use_fused_kernels", "fused")) if c.get(key)]
    saves += ["no-compile"] if c.get("use_torch_compile") is False else []  # verl compiles by default
    return (f"{layout} | rollout tp{c['rollout_tp']} mem {c['gpu_memory_utilization']:.2f} seqs {c['max_num_seqs']} "
            f"| {batch} | {' '.join(saves) or 'no savers'}")


# What the configuration column's short words mean (candidate_summary), printed under every table that uses them.
LEGEND = ("configuration: fsdp/fsdp2/megatron = actor engine (tp/pp/vpp/cp/ep = its tensor/pipeline/virtual-pipeline/"
          "context/expert parallel sizes, sp = Ulysses sequence parallel); rollout tp = vLLM tensor parallel, mem = "
          "gpu_memory_utilization, seqs = max_num_seqs; micro A/B/C = ppo / log-prob / reference log-prob micro-batch per "
          "GPU; dyn A/B tok = dynamic batching, ppo / log-prob max tokens per GPU; ckpt = gradient checkpointing; p-off / "
          "o-off / a-off / ref-off = param / optimizer / activation / reference-param offload; liger = use_liger; "
          "fused = use_fused_kernels; no-compile = use_torch_compile off (verl's default is on)")


def trial_line(t: optuna.trial.FrozenTrial) -> str:
    r = TrialRecord.of(t)
    tag = (f" ({t.user_attrs.get('label') or 'baseline'})" if r.baseline or t.user_attrs.get("verl_default")
           else f" ({t.user_attrs['label']})" if t.user_attrs.get("label") else "")
    if r.feasible_measurement:
        mfu = "n/a" if r.mfu is None else f"{r.mfu:.2f}"
        return (f"trial {r.number:3d}{tag} {r.state:9s} {r.tokens_per_s_per_gpu:8.0f} tok/s/GPU  MFU {mfu}  "
                f"peak {r.peak_mem_gib:5.1f} GiB  {candidate_summary(t.user_attrs.get('candidate', {}))}"
                + predicted_oom_note(t.user_attrs))
    return f"trial {r.number:3d}{tag} {r.state:9s} {r.reason}"


def predicted_oom_note(attrs: dict) -> str:
    """The memory model's OOM prediction for a job that ran anyway (the user's own: search/driver.py)."""
    note = attrs.get("predicted_oom")
    if not note:
        return ""
    return f"  [{note}" + (f"; {attrs['gate_learned']}" if attrs.get("gate_learned") else "") + "]"


def print_best_table(study: optuna.Study, *, simulated: bool, k: int = 5) -> None:
    best = best_records(study, k=k)
    base = baseline_record(study)
    label = baseline_label(study)
    default = verl_default_record(study)
    title = f"best trials of {study.study_name}" + (" (SIMULATED by the calibrated model)" if simulated else "")
    table = Table(title=title)
    for col in ("trial", "tokens/s/GPU", f"vs {label}", "actor MFU", "peak GiB", "configuration"):
        table.add_column(col, justify="right" if col not in ("configuration",) else "left")
    base_tps = base.tokens_per_s_per_gpu if base and base.feasible_measurement else None
    rows = list(best)
    for extra in (base, default):
        if extra and extra.feasible_measurement and all(r.number != extra.number for r in rows):
            rows.append(extra)
    for r in rows:
        gain = f"x{r.tokens_per_s_per_gpu / base_tps:.2f}" if base_tps else "n/a"
        name = f"{r.number}" + (f" ({label})" if r.baseline else "") + (
            " (verl default)" if default is not None and r.number == default.number else "")
        table.add_row(name, f"{r.tokens_per_s_per_gpu:.0f}", gain, "n/a" if r.mfu is None else f"{r.mfu:.3f}",
                      f"{r.peak_mem_gib:.1f}", candidate_summary(r.user_attrs.get("candidate", {})))
    _console.print(table)
    if base is not None and not base.feasible_measurement:
        _console.print(f"trial {base.number} ({label}): {base.state}, {base.reason}", markup=False)
    elif base is not None and base.user_attrs.get("predicted_oom"):
        _console.print(f"trial {base.number} ({label}): {predicted_oom_note(base.user_attrs).strip()}", markup=False)
    _console.print(LEGEND, markup=False, soft_wrap=True)


def repeat_mark(user_attrs: dict) -> str:
    """" cN" / " vN" / " hN" for a trial that probed trial N's configuration again (search/confirm.py), else ""."""
    role = probe_role(user_attrs)
    of = user_attrs.get("verifies", user_attrs.get("confirms", user_attrs.get("holds_out")))
    return {"confirm": f" c{of}", "verify": f" v{of}", "holdout": f" h{of}"}.get(role, "")


def print_trials(study: optuna.Study) -> None:
    recs = records(study)
    table = Table(title=f"study {study.study_name}: {len(recs)} trials")
    for col in ("trial", "state", "tokens/s/GPU", "MFU", "peak GiB", "reason / configuration"):
        table.add_column(col)
    best = best_records(study, k=1)
    best_number = best[0].number if best else None
    default = verl_default_record(study)
    for r in recs:
        cand = r.user_attrs.get("candidate", {})
        detail = candidate_summary(cand) if r.feasible_measurement else r.reason
        mark = (" *" if r.baseline else "") + (" d" if default is not None and r.number == default.number else "") \
            + (" BEST" if r.number == best_number else "") + repeat_mark(r.user_attrs)
        table.add_row(str(r.number) + mark, r.state,
                      "" if r.tokens_per_s_per_gpu is None else f"{r.tokens_per_s_per_gpu:.0f}",
                      "" if r.mfu is None else f"{r.mfu:.3f}",
                      "" if r.peak_mem_gib is None else f"{r.peak_mem_gib:.1f}", detail)
    _console.print(table)
    # the node profile the study's model started from (storage/node_profile.py), or why it had none
    _console.print(describe_summary(study.user_attrs.get(PROFILE_ATTR)), markup=False, soft_wrap=True)
    lengths = lengths_line(study)
    if lengths:
        _console.print(lengths, markup=False, soft_wrap=True)
    timed = [r for r in recs if r.user_attrs.get("stage_s")]
    if timed:  # where each launch's time went (autotune/verl/stages.py; the sim's are its own prior, labelled)
        _console.print("where each probe's time went, seconds from its launch:", markup=False)
        shown = set()
        for r in timed:
            launch = r.user_attrs.get("launch") or {}
            key = launch_of(r.user_attrs, r.number)
            if key in shown:
                continue
            shown.add(key)
            label = " (SIMULATED)" if r.user_attrs.get("simulated") else ""
            who = (f"trials {', '.join(map(str, launch['trials']))} (one launch)" if len(launch.get("trials") or ()) > 1
                   else f"trial {r.number}")
            scored = (f"; scored at the launch's rollout, gen {launch['rollout_gen_s']:.1f} s (verl times gen on a "
                      "2-s poll)" if launch.get("rollout_gen_s") is not None else "")
            _console.print(f"  {who}{label}: {describe_stages(r.user_attrs['stage_s'])}{scored}", markup=False,
                           soft_wrap=True)
    label = baseline_label(study)
    base = baseline_record(study)
    if best and base is not None and base.feasible_measurement:  # what the best changed (storage/changes.py)
        changed = describe_changes(changes_doc(trial_doc(base), trial_doc(best[0])), label)
        if changed:
            _console.print(changed, markup=False, soft_wrap=True)
    base_text = "your job (baseline)" if label == "your job" else "verl's default configuration (baseline)"
    repeats = ("; cN a confirmation of trial N, vN the export's verifying probe of trial N, hN a held-out probe of "
               "trial N not yet read" if any(repeat_mark(r.user_attrs) for r in recs) else "")
    _console.print(f"* {base_text}" + ("; d verl's default configuration" if default else "")
                   + ("; BEST the best feasible trial, the one `autotune export` writes" if best_number is not None
                      else "; no feasible trial yet") + repeats, markup=False, soft_wrap=True)
    _console.print(LEGEND, markup=False, soft_wrap=True)


def print_gpus() -> None:
    from autotune.hardware import ALIASES, GPUS, detect_gpus, match_device_name

    table = Table(title="GPU types (--gpu takes any name or alias, any case, or the name nvidia-smi prints)")
    for col in ("name", "aliases", "memory GiB", "bf16 TFLOP/s", "HBM TB/s", "source"):
        table.add_column(col)
    for g in GPUS.values():
        aliases = ", ".join(a for a, target in ALIASES.items() if target == g.name) or "-"
        table.add_row(g.name, aliases, f"{g.mem_gib:.1f}", f"{g.peak_bf16_flops / 1e12:.0f}",
                      f"{g.hbm_bytes_per_s / 1e12:.2f}", g.source)
    _console.print(table)
    _console.print("A100 alone is ambiguous (40 or 80 GB): give A100-40GB or A100-80GB unless one is detected.",
                   markup=False)
    detected = detect_gpus()
    if detected is None:
        _console.print("detected: no NVIDIA GPU (runs assume H200 unless --gpu says otherwise)", markup=False)
    else:
        match = match_device_name(detected.device_name)
        _console.print(f"detected: {detected.count} x {detected.device_name} -> "
                       f"{match.name if match else 'not in the table; pass --gpu'}", markup=False)


def print_models() -> None:
    table = Table(title="built-in models: the fallback when no config.json is at hand (a local folder or the HF "
                        "cache is read first)")
    for col in ("name", "HF id", "params", "layers", "hidden", "heads/kv", "FFN", "experts", "vocab"):
        table.add_column(col)
    for m in MODELS.values():
        experts = f"{m.num_experts} (top {m.num_experts_per_tok})" if m.is_moe else "-"
        ffn = m.moe_intermediate_size if m.is_moe else m.intermediate_size
        table.add_row(m.name, m.hf_id, f"{m.param_count() / 1e9:.2f}B", str(m.num_layers), str(m.hidden_size),
                      f"{m.num_heads}/{m.num_kv_heads}", str(ffn), experts, str(m.vocab_size))
    _console.print(table)
