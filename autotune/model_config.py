"""The user's model, exactly: shapes from its own config.json, never a look-alike.

`--model` and `--from`'s `actor_rollout_ref.model.path` name a local folder or a Hugging Face id. The shapes
come from that model's `config.json`: the folder's own, or the one in the local Hugging Face cache
(`huggingface_hub`'s layout: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`,
`models--ORG--NAME/snapshots/REV/config.json`, https://huggingface.co/docs/huggingface_hub/guides/manage-cache).
Nothing is downloaded, so nothing is attempted offline. autotune's built-in table (models.py) is only the
fallback for an id with no config.json at hand, and the run says so. Whatever the source, the exported
`model.path` is the string the user gave (`ModelSpec.path`).

config.json is read as JSON (transformers is not a dependency of the package). The keys per `model_type`
are those of transformers' config classes (`Qwen2Config`, `Qwen3Config`, `Qwen3MoeConfig`, `LlamaConfig`,
`MistralConfig`, `MixtralConfig`, `DeepseekV2Config`, `DeepseekV3Config`, `GptOssConfig`); a test checks
each reader against the real config.json files in tests/data/model_configs/.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from autotune.errors import ConfigError
from autotune.models import MODELS, ModelSpec, lookup_table

# model_type -> (architecture when config.json names none, keys config.json must hold)
_COMMON = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
SUPPORTED = {
    "qwen2": ("Qwen2ForCausalLM", _COMMON),
    "qwen3": ("Qwen3ForCausalLM", _COMMON),
    "qwen3_moe": ("Qwen3MoeForCausalLM", _COMMON + ("num_experts", "num_experts_per_tok", "moe_intermediate_size")),
    "llama": ("LlamaForCausalLM", _COMMON),
    "mistral": ("MistralForCausalLM", _COMMON),
    "mixtral": ("MixtralForCausalLM", _COMMON + ("num_local_experts", "num_experts_per_tok")),
    "deepseek_v2": ("DeepseekV2ForCausalLM", _COMMON + ("n_routed_experts", "num_experts_per_tok",
                                                        "moe_intermediate_size", "kv_lora_rank",
                                                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")),
    "deepseek_v3": ("DeepseekV3ForCausalLM", _COMMON + ("n_routed_experts", "num_experts_per_tok",
                                                        "moe_intermediate_size", "kv_lora_rank",
                                                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")),
    "gpt_oss": ("GptOssForCausalLM", _COMMON + ("num_local_experts",)),
}


def hf_cache_dir() -> Path:
    """huggingface_hub's cache folder, resolved as huggingface_hub/constants.py does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cached_config(hf_id: str) -> Path | None:
    """config.json of `hf_id` in the local Hugging Face cache: the snapshot `refs/main` names, else the newest."""
    repo = hf_cache_dir() / ("models--" + hf_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip() / "config.json"
        if pinned.is_file():
            return pinned
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None


def looks_like_path(name: str) -> bool:
    """A local folder, as verl's copy_to_local treats model.path: absolute, ~, ./ or ../, or more than ORG/NAME."""
    return name.startswith(("/", "~", "./", "../", ".\\")) or name.count("/") > 1 or name in (".", "..")


def _hf_id_shape(name: str) -> bool:
    return name.count("/") == 1 and "://" not in name and not looks_like_path(name)


def read_config(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a model config (expected a JSON object)")
    return doc


def _model_name(path: str) -> str:
    """A lower-case name for study names and tables: the folder or repository name."""
    base = path.rstrip("/").split("/")[-1] or "model"
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in base.lower())[:80]


def spec_from_config(cfg: dict, *, path: str, source: str) -> ModelSpec:
    """ModelSpec from a config.json; an unsupported model_type or a missing key is one ConfigError."""
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers: the language model's config
        raise ConfigError(f"{source}: model_type {cfg.get('model_type')!r} is a multimodal model; autotune models "
                          f"text-only GRPO (supported model_type: {', '.join(SUPPORTED)})")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported: autotune has no memory and FLOPs "
                          f"model for it (supported: {', '.join(SUPPORTED)})")
    default_arch, required = SUPPORTED[model_type]
    missing = [k for k in required if cfg.get(k) is None]
    if missing:
        raise ConfigError(f"{source}: model_type {model_type!r} but config.json lacks {', '.join(missing)}")
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    archs = cfg.get("architectures") or [default_arch]
    fields = dict(
        name=_model_name(path), hf_id=path if _hf_id_shape(path) else (cfg.get("_name_or_path") or path),
        architecture=archs[0], model_type=model_type, hidden_size=h, num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=kv, head_dim=int(cfg.get("head_dim") or h // heads),
        intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
        # transformers' defaults for these classes are False (PretrainedConfig's True is overridden by each)
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), path=path,
        # read as verl reads it (workers/rollout/utils.py:31-40); 0: not in this config.json
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
        source=source, shapes_from=f"its config.json ({source})", published_params=0.0)
    if model_type == "qwen2":
        fields["qkv_bias"] = True  # Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
    elif model_type in ("qwen3", "qwen3_moe"):
        fields.update(qk_norm=True, qkv_bias=bool(cfg.get("attention_bias", False)))
    elif model_type in ("llama", "mistral", "mixtral"):
        bias = bool(cfg.get("attention_bias", False))  # LlamaAttention: one flag for q, k, v and o
        fields.update(qkv_bias=bias, o_bias=bias)
        if cfg.get("mlp_bias"):
            raise ConfigError(f"{source}: model_type {model_type!r} with mlp_bias=true is not supported "
                              "(autotune models bias-free MLPs)")
    if model_type == "qwen3_moe":
        sparse_step = int(cfg.get("decoder_sparse_step", 1))
        if sparse_step != 1 or cfg.get("mlp_only_layers"):
            raise ConfigError(f"{source}: qwen3_moe with dense layers (decoder_sparse_step={sparse_step}, "
                              f"mlp_only_layers={cfg.get('mlp_only_layers')}) is not supported")
        fields.update(num_experts=int(cfg["num_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["moe_intermediate_size"]))
    elif model_type == "mixtral":  # MixtralSparseMoeBlock: w1/w2/w3 of intermediate_size per expert
        fields.update(num_experts=int(cfg["num_local_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["intermediate_size"]))
    elif model_type == "gpt_oss":  # GptOssExperts: biased gate_up/down of intermediate_size; biased router
        top_k = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
        if top_k is None:
            raise ConfigError(f"{source}: model_type 'gpt_oss' but config.json lacks num_experts_per_tok")
        bias = bool(cfg.get("attention_bias", True))
        fields.update(num_experts=int(cfg["num_local_experts"]), num_experts_per_tok=int(top_k),
                      moe_intermediate_size=int(cfg["intermediate_size"]), qkv_bias=bias, o_bias=bias,
                      attn_sinks=True, expert_bias=True)
    elif model_type in ("deepseek_v2", "deepseek_v3"):
        freq = int(cfg.get("moe_layer_freq", 1))
        if freq != 1:
            raise ConfigError(f"{source}: {model_type} with moe_layer_freq={freq} is not supported (only 1)")
        fields.update(num_experts=int(cfg["n_routed_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                      n_shared_experts=int(cfg.get("n_shared_experts") or 0),
                      first_k_dense=int(cfg.get("first_k_dense_replace", 0)),
                      q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                      qk_nope_head_dim=int(cfg["qk_nope_head_dim"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                      v_head_dim=int(cfg["v_head_dim"]),
                      # DeepseekV3TopkRouter keeps e_score_correction_bias (noaux_tc); V2's gate has none
                      router_score_bias=model_type == "deepseek_v3")
    spec = ModelSpec(**fields)
    return replace(spec, published_params=float(spec.param_count()))


MAX_MODEL_NAME_CHARS = 4096  # Linux's PATH_MAX; a Hugging Face id is at most 96


def resolve_model(name: str) -> ModelSpec:
    """The model the user named, with where its shapes came from; its export path is `name` itself."""
    text = str(name).strip()
    if not text:
        raise ConfigError("the model name is empty; give a Hugging Face id or a local folder")
    if len(text) > MAX_MODEL_NAME_CHARS:
        raise ConfigError(f"the model name is longer than {MAX_MODEL_NAME_CHARS} characters (a path's limit); "
                          f"it starts {text[:40]!r}")
    local = Path(text).expanduser()
    try:
        is_folder = looks_like_path(text) or local.is_dir()
        exists = local.exists()
    except OSError as exc:  # a path component longer than the file system's 255 bytes
        raise ConfigError(f"model {text[:40]!r}...: not a usable path ({exc.strerror or exc})") from None
    if is_folder:
        if not exists:
            raise ConfigError(f"model folder {text} does not exist")
        if not local.is_dir():
            raise ConfigError(f"model path {text} is not a folder (a model folder holds config.json)")
        config = local / "config.json"
        if not config.is_file():
            raise ConfigError(f"model folder {text} has no config.json")
        # exported as given where absolute; `~` and a relative folder as the absolute path (verl expands no `~`,
        # and a probe runs in its own folder)
        path = text if os.path.isabs(text) else os.path.abspath(local)
        return spec_from_config(read_config(config), path=path, source=str(config))
    if _hf_id_shape(text):
        cached = cached_config(text)
        if cached is not None:
            return spec_from_config(read_config(cached), path=text, source=str(cached))
    found = lookup_table(text)
    if found is None:
        where = (f"no config.json for it in the local Hugging Face cache ({hf_cache_dir()}) and it is not in "
                 "autotune's table" if _hf_id_shape(text) else "not a local folder, a Hugging Face id or a known name")
        raise ConfigError(f"unknown model {text!r}: {where}; pass the model's local folder, or fetch its config "
                          f"with `huggingface-cli download {text if _hf_id_shape(text) else 'ORG/NAME'} config.json` "
                          f"(known names: `autotune models`)")
    spec, matched_id = found
    path = text if _hf_id_shape(text) else matched_id
    note = ("autotune's built-in table, same architecture and shapes as " + spec.hf_id if path != spec.hf_id
            else "autotune's built-in table")
    name_out = spec.name if text.lower() == spec.name or path == spec.hf_id else _model_name(path)
    # an alias shares the entry's shapes, not always its context (Qwen2.5-7B: 131072, its Instruct entry: 32768)
    context = spec.max_position_embeddings if path == spec.hf_id else 0
    return replace(spec, name=name_out, path=path, max_position_embeddings=context,
                   shapes_from=f"{note} (no config.json at hand: not a local folder, not in the HF cache)")


__all__ = ["MODELS", "SUPPORTED", "cached_config", "hf_cache_dir", "resolve_model", "spec_from_config"]
