"""What the best configuration changed against the baseline, and which phases of verl's step it moved (issue 32
item 4): two trials with the same short configuration string can differ in a knob that decides their ranking, and a
speedup alone does not say what bought it."""

from __future__ import annotations

# knobs a batching mode leaves unread: verl 0.9.1's engines split a batch by the token budget with dynamic batching
# and by the micro-batch size without it (`workers/engine/utils.py:108-129`, prepare_micro_batches), so a difference
# in the unread one changes nothing
_MICRO = ("ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu")
_TOKENS = ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu")
# verl's step phases as its timing_s/* metrics name them; the step itself is the sum, not a phase
_NOT_A_PHASE = {"step"}


def knob_changes(base: dict, other: dict) -> list[dict]:
    """Each knob whose value differs, as {knob, from, to}, in the candidate's own order; knobs the batching mode of
    both leaves unread are left out."""
    unread = set()
    if base.get("use_dynamic_bsz") and other.get("use_dynamic_bsz"):
        unread.update(_MICRO)
    elif not base.get("use_dynamic_bsz") and not other.get("use_dynamic_bsz"):
        unread.update(_TOKENS)
    return [{"knob": k, "from": base.get(k), "to": other[k]} for k in other
            if k not in unread and k in base and base[k] != other[k]]


def phase_changes(base_phase_s: dict | None, other_phase_s: dict | None) -> list[dict]:
    """Each phase both steps timed, as {phase, from_s, to_s}, the largest move first."""
    base_phase_s, other_phase_s = base_phase_s or {}, other_phase_s or {}
    rows = [{"phase": p, "from_s": base_phase_s[p], "to_s": other_phase_s[p]} for p in other_phase_s
            if p in base_phase_s and p not in _NOT_A_PHASE]
    return sorted(rows, key=lambda r: abs(r["to_s"] - r["from_s"]), reverse=True)


def changes_doc(base: dict, best: dict) -> dict | None:
    """result.json's `changes_vs_baseline` from the two trials' documents (storage/results.py trial_doc)."""
    if base is None or best is None or base["trial"] == best["trial"]:
        return None
    return {"baseline_trial": base["trial"], "best_trial": best["trial"],
            "knobs": knob_changes(base["params"], best["params"]),
            "phase_s": phase_changes(base.get("phase_s"), best.get("phase_s")),
            "simulated": bool(base.get("simulated") or best.get("simulated"))}


def describe_changes(doc: dict | None, baseline_is: str, *, phases: int = 4) -> str | None:
    """One line: each changed knob old -> new, then the phases that moved most (measured, or labelled simulated)."""
    if not doc:
        return None
    knobs = ", ".join(f"{c['knob']} {_value(c['from'])} -> {_value(c['to'])}" for c in doc["knobs"]) or "nothing"
    text = f"trial {doc['best_trial']} against {baseline_is} (trial {doc['baseline_trial']}): changed {knobs}"
    moved = [p for p in doc["phase_s"] if abs(p["to_s"] - p["from_s"]) >= 0.05][:phases]
    if moved:
        label = "simulated " if doc["simulated"] else ""
        text += f"; {label}phase s " + ", ".join(f"{p['phase']} {p['from_s']:.1f} -> {p['to_s']:.1f}" for p in moved)
    return text


def _value(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
