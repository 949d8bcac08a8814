"""The H200 calibration measurements, and what the model predicts for each of them (benchmarks/fit_calibration.py
and tests/model/test_calibration.py read them; the package itself does not).

Rows come from autotune/data/h200-*.json (see docs/model.md for provenance). The measurements are
single-GPU PyTorch runs of Qwen2.5 shapes in bf16 (HF modules, sdpa, fused AdamW on bf16 parameters,
fp32 log-softmax over the full vocabulary), so predictions here use that setting: 2-byte parameters
and gradients, 4 bytes of Adam state per parameter, nothing sharded, memory as
torch.cuda.max_memory_allocated (no context or fragmentation). The same building blocks (activations,
logits, KV, the MFU curve) then serve verl's engines in memory.py and cost.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from autotune.hardware import GIB, get_gpu
from autotune.models import ModelSpec, get_model
from autotune.model.calibration import ACTIVATIONS, THROUGHPUT, ActivationConstants, ThroughputConstants
from autotune.model.cost import train_mfu
from autotune.verl.flops import train_flops_uniform
from autotune.model.memory import (BF16, activation_bytes_per_token_per_layer, forward_logits_bytes,
                                        train_activation_bytes, train_logits_bytes)

FILES = ("h200-train-probe.json", "h200-phases-probe.json")
_MODEL_OF = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "3b": "qwen2.5-3b", "7b": "qwen2.5-7b"}
H200 = get_gpu("H200")
ADAM_BF16_BYTES = 4  # exp_avg + exp_avg_sq in the parameter dtype (bf16)


@dataclass(frozen=True)
class Row:
    source: str
    raw: dict

    @property
    def kind(self) -> str:
        return self.raw["kind"]

    @property
    def model(self) -> ModelSpec:
        return get_model(_MODEL_OF[self.raw["model"]])

    @property
    def oom(self) -> bool:
        return bool(self.raw.get("oom"))

    @property
    def label(self) -> str:
        r = self.raw
        shape = f"mb{r['mb']} x {r['seq']}" if "mb" in r else f"bs{r['bs']} p{r['prompt']}+{r['new']}"
        flags = "".join(f" {k}" for k in ("ckpt", "compile") if r.get(k))
        return f"{r['kind']} {r['model']} {shape}{flags}"


def load_rows() -> list[Row]:
    rows = []
    for name in FILES:
        text = resources.files("autotune.data").joinpath(name).read_text()
        rows += [Row(name, r) for r in json.loads(text)]
    return rows


def memory_rows(rows: list[Row]) -> list[Row]:
    """Rows whose peak reflects the workload. `gen` rows are excluded: their peak (6.7 GiB for 1.5B at
    batch 32 and 128 alike) is the fp32->bf16 model construction, not generation."""
    return [r for r in rows if r.kind in ("train", "logprob", "decode") and ("peak_gb" in r.raw or r.oom)]


def predict_peak_gib(row: Row, act: ActivationConstants = ACTIVATIONS) -> float:
    m, r = row.model, row.raw
    n_params = m.param_count()
    weights = BF16 * n_params
    if r["kind"] == "train":
        tok = r["mb"] * r["seq"]
        ckpt = bool(r.get("ckpt"))
        acts = train_activation_bytes(m, tok, layers=m.num_layers, checkpointing=ckpt, c=act)
        inputs = act.ckpt_per_h * m.hidden_size * tok * m.num_layers
        adam = ADAM_BF16_BYTES * n_params
        # start of backward: no gradients yet; end of backward: all gradients, layer inputs + logits kept
        start = weights + adam + acts + train_logits_bytes(m, tok, start_of_backward=True, c=act)
        end = weights + adam + BF16 * n_params + inputs + train_logits_bytes(m, tok, start_of_backward=False, c=act)
        return max(start, end) / GIB
    if r["kind"] == "logprob":
        tok = r["mb"] * r["seq"]
        return (weights + forward_logits_bytes(m, tok, c=act) + activation_bytes_per_token_per_layer(m, act) * tok) / GIB
    if r["kind"] == "decode":
        # HF forward at prefill materialises bf16 logits for every prompt position (calibration README)
        kv = m.kv_cache_bytes_per_token() * r["bs"] * (r["prompt"] + r["new"])
        prefill_logits = BF16 * r["bs"] * r["prompt"] * m.vocab_size
        return (weights + kv + prefill_logits) / GIB
    raise ValueError(f"no memory prediction for kind {r['kind']!r}")


def throughput_rows(rows: list[Row]) -> list[Row]:
    """Training and forward-only rows with a measured speed. compile rows are listed but not modelled:
    verl 0.9.1 compiles only entropy_from_logits, so whole-model compile speed-ups do not transfer."""
    return [r for r in rows if r.kind in ("train", "logprob") and "tok_s" in r.raw and not r.raw.get("compile")]


def predict_tokens_per_s(row: Row, c: ThroughputConstants = THROUGHPUT) -> float:
    m, r = row.model, row.raw
    tok = r["mb"] * r["seq"]
    flops_per_token = train_flops_uniform(m, r["mb"], r["seq"]) / tok
    mfu = train_mfu(tok, m.hidden_size, c)
    if r["kind"] == "logprob":
        return H200.peak_bf16_flops * mfu * c.forward_mfu_factor / (flops_per_token / 3)
    if r.get("ckpt"):
        mfu *= c.ckpt_throughput_factor
    return H200.peak_bf16_flops * mfu / flops_per_token


def errors(act: ActivationConstants = ACTIVATIONS, thr: ThroughputConstants = THROUGHPUT) -> dict:
    """Relative errors of the current constants on every usable row, and OOM agreement."""
    rows = load_rows()
    mem, oom = [], []
    for row in memory_rows(rows):
        pred = predict_peak_gib(row, act)
        if row.oom:
            oom.append((row.label, pred, pred > H200.mem_gib))
        else:
            mem.append((row.label, row.raw["peak_gb"], pred, pred / row.raw["peak_gb"] - 1))
    speed = [(row.label, row.raw["tok_s"], p, p / row.raw["tok_s"] - 1)
             for row in throughput_rows(rows) for p in [predict_tokens_per_s(row, thr)]]
    return {"memory": mem, "oom": oom, "throughput": speed}
