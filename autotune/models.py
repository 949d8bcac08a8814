"""Known-model table: plain data with a source per entry (litgpt's config.py style).

Shapes are copied from each model's Hugging Face `config.json` (the `source` link). `published_params`
is the parameter count stated on the model card (or computed by transformers for the same config), and a
test checks that `param_count()` reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str  # autotune's key, lower case: "qwen2.5-7b"
    hf_id: str
    architecture: str  # transformers class, used by the torch backend
    model_type: str  # HF model_type, selects verl's FLOPs formula
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    published_params: float  # for the invariant test
    source: str

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def attn_params_per_layer(self) -> int:
        proj = self.hidden_size * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden_size
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        norm = 2 * self.head_dim if self.qk_norm else 0
        return proj + bias + norm

    def mlp_params_per_layer(self) -> int:
        """All expert weights for MoE (what must be stored), the SwiGLU MLP for dense."""
        if self.is_moe:
            return self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size + self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size

    def active_mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.num_experts_per_tok * 3 * self.hidden_size * self.moe_intermediate_size + self.hidden_size * self.num_experts
        return self.mlp_params_per_layer()

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def param_count(self) -> int:
        per_layer = self.attn_params_per_layer() + self.mlp_params_per_layer() + 2 * self.hidden_size
        return self.num_layers * per_layer + self.embedding_params() + self.hidden_size

    def active_param_count(self) -> int:
        per_layer = self.attn_params_per_layer() + self.active_mlp_params_per_layer() + 2 * self.hidden_size
        return self.num_layers * per_layer + self.embedding_params() + self.hidden_size

    def hf_config(self) -> dict:
        """Keyword arguments for the transformers config class of `architecture`."""
        cfg = dict(hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
                   num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                   intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
                   tie_word_embeddings=self.tie_word_embeddings, head_dim=self.head_dim)
        if self.is_moe:
            cfg.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                       moe_intermediate_size=self.moe_intermediate_size)
        return cfg


def _qwen25(name, *, h, layers, heads, kv, inter, vocab, tie, params, repo):
    return ModelSpec(name=name, hf_id=f"Qwen/{repo}", architecture="Qwen2ForCausalLM", model_type="qwen2",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=h // heads,
                     intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tie, qkv_bias=True,
                     published_params=params, source=f"https://huggingface.co/Qwen/{repo}/blob/main/config.json")


def _qwen3(name, *, h, layers, heads, kv, inter, tie, params, repo):
    return ModelSpec(name=name, hf_id=f"Qwen/{repo}", architecture="Qwen3ForCausalLM", model_type="qwen3",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=128,
                     intermediate_size=inter, vocab_size=151936, tie_word_embeddings=tie, qk_norm=True,
                     published_params=params, source=f"https://huggingface.co/Qwen/{repo}/blob/main/config.json")


def _llama(name, *, h, layers, heads, kv, inter, tie, params, repo):
    return ModelSpec(name=name, hf_id=f"meta-llama/{repo}", architecture="LlamaForCausalLM", model_type="llama",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=h // heads,
                     intermediate_size=inter, vocab_size=128256, tie_word_embeddings=tie,
                     published_params=params, source=f"https://huggingface.co/meta-llama/{repo}/blob/main/config.json")


def _qwen3_moe(name, *, h, layers, heads, kv, moe_inter, experts, topk, params, repo):
    return ModelSpec(name=name, hf_id=f"Qwen/{repo}", architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=128,
                     intermediate_size=moe_inter * 8, vocab_size=151936, tie_word_embeddings=False, qk_norm=True,
                     num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=moe_inter,
                     published_params=params, source=f"https://huggingface.co/Qwen/{repo}/blob/main/config.json")


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _qwen25("qwen2.5-0.5b", h=896, layers=24, heads=14, kv=2, inter=4864, vocab=151936, tie=True, params=0.494e9, repo="Qwen2.5-0.5B-Instruct"),
        _qwen25("qwen2.5-1.5b", h=1536, layers=28, heads=12, kv=2, inter=8960, vocab=151936, tie=True, params=1.54e9, repo="Qwen2.5-1.5B-Instruct"),
        _qwen25("qwen2.5-3b", h=2048, layers=36, heads=16, kv=2, inter=11008, vocab=151936, tie=True, params=3.09e9, repo="Qwen2.5-3B-Instruct"),
        _qwen25("qwen2.5-7b", h=3584, layers=28, heads=28, kv=4, inter=18944, vocab=152064, tie=False, params=7.62e9, repo="Qwen2.5-7B-Instruct"),
        _qwen25("qwen2.5-14b", h=5120, layers=48, heads=40, kv=8, inter=13824, vocab=152064, tie=False, params=14.7e9, repo="Qwen2.5-14B-Instruct"),
        _qwen25("qwen2.5-32b", h=5120, layers=64, heads=40, kv=8, inter=27648, vocab=152064, tie=False, params=32.5e9, repo="Qwen2.5-32B-Instruct"),
        _qwen25("qwen2.5-72b", h=8192, layers=80, heads=64, kv=8, inter=29568, vocab=152064, tie=False, params=72.7e9, repo="Qwen2.5-72B-Instruct"),
        _qwen3("qwen3-0.6b", h=1024, layers=28, heads=16, kv=8, inter=3072, tie=True, params=0.6e9, repo="Qwen3-0.6B"),
        _qwen3("qwen3-1.7b", h=2048, layers=28, heads=16, kv=8, inter=6144, tie=True, params=1.7e9, repo="Qwen3-1.7B"),
        _qwen3("qwen3-4b", h=2560, layers=36, heads=32, kv=8, inter=9728, tie=True, params=4.0e9, repo="Qwen3-4B"),
        _qwen3("qwen3-8b", h=4096, layers=36, heads=32, kv=8, inter=12288, tie=False, params=8.2e9, repo="Qwen3-8B"),
        _qwen3("qwen3-14b", h=5120, layers=40, heads=40, kv=8, inter=17408, tie=False, params=14.8e9, repo="Qwen3-14B"),
        _qwen3("qwen3-32b", h=5120, layers=64, heads=64, kv=8, inter=25600, tie=False, params=32.8e9, repo="Qwen3-32B"),
        _qwen3_moe("qwen3-30b-a3b", h=2048, layers=48, heads=32, kv=4, moe_inter=768, experts=128, topk=8, params=30.5e9, repo="Qwen3-30B-A3B"),
        _qwen3_moe("qwen3-235b-a22b", h=4096, layers=94, heads=64, kv=4, moe_inter=1536, experts=128, topk=8, params=235e9, repo="Qwen3-235B-A22B"),
        _llama("llama-3.2-1b", h=2048, layers=16, heads=32, kv=8, inter=8192, tie=True, params=1.24e9, repo="Llama-3.2-1B-Instruct"),
        _llama("llama-3.2-3b", h=3072, layers=28, heads=24, kv=8, inter=8192, tie=True, params=3.21e9, repo="Llama-3.2-3B-Instruct"),
        _llama("llama-3.1-8b", h=4096, layers=32, heads=32, kv=8, inter=14336, tie=False, params=8.03e9, repo="Llama-3.1-8B-Instruct"),
        _llama("llama-3.1-70b", h=8192, layers=80, heads=64, kv=8, inter=28672, tie=False, params=70.6e9, repo="Llama-3.1-70B-Instruct"),
    )
}


# Same architecture and shape as a table entry (each config.json compared field by field).
_ALIASES = {
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2-0.5B-Instruct", "Qwen/Qwen2-0.5B"),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2-1.5B-Instruct"),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B",),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", "Qwen/Qwen2-7B-Instruct", "Qwen/Qwen2-7B", "Qwen/Qwen2.5-Math-7B",
                   "Qwen/Qwen2.5-Coder-7B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-Coder-14B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B"),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-Coder-32B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B", "Qwen/Qwen2-72B-Instruct", "Qwen/Qwen2-72B"),
    "qwen3-8b": ("Qwen/Qwen3-8B-Base",),
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
}


def get_model(name: str) -> ModelSpec:
    """Exact (case-insensitive) lookup by autotune key, HF id or a path ending in one; a miss lists the choices."""
    key = name.strip().rstrip("/").lower()
    for spec in MODELS.values():
        ids = [spec.hf_id.lower()] + [a.lower() for a in _ALIASES.get(spec.name, ())]
        names = {spec.name} | set(ids) | {i.removesuffix("-instruct") for i in ids}
        basenames = {i.split("/")[-1] for i in names}
        if key in names or key.split("/")[-1] in basenames:
            return spec
    raise ConfigError(f"unknown model {name!r}; known models: {', '.join(MODELS)} (see `autotune models`)")
