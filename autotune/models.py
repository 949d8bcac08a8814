"""Known-model table: plain data with a source per entry (litgpt's config.py style).

Shapes are copied from each model's Hugging Face `config.json` (the `source` link). `published_params`
is the parameter count stated on the model card (or computed by transformers for the same config), and a
test checks that `param_count()` reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
    # Shapes beyond the Qwen/Llama family, read from config.json (autotune/model_config.py):
    n_shared_experts: int = 0  # DeepSeek: experts every token passes, each moe_intermediate_size wide
    first_k_dense: int = 0  # DeepSeek's first_k_dense_replace: leading layers with a dense MLP
    q_lora_rank: int = 0  # DeepSeek MLA (0: no query compression)
    kv_lora_rank: int = 0  # DeepSeek MLA latent KV width; > 0 means MLA attention
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    o_bias: bool = False  # gpt-oss: attention_bias covers o_proj too
    attn_sinks: bool = False  # gpt-oss: one learned sink logit per head
    expert_bias: bool = False  # gpt-oss: biased expert projections and router
    router_score_bias: bool = False  # DeepSeek-V3: e_score_correction_bias, one per routed expert
    # config.json's max_position_embeddings: the context verl gives vLLM when rollout.max_model_len is null
    # (verl/workers/rollout/vllm_rollout/vllm_async_server.py:1103-1105); 0: not known
    max_position_embeddings: int = 0
    published_params: float  # for the invariant test
    source: str
    path: str = ""  # what the user named (model.path in the export); "" means hf_id
    shapes_from: str = ""  # where the shapes came from, said on the run's first line

    @property
    def model_path(self) -> str:
        """The exact model.path to export: the user's own string, never a substitute."""
        return self.path or self.hf_id

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Per-token K (or V) width; MLA's is its compressed latent plus the shared rope key."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def attn_core_head_dim(self) -> float:
        """Head width of the score and value matmuls. MLA: (q_head + v_head) / 2, so that 6 x this x heads
        is verl's 3 x (q_head_dim + v_head_dim) x heads (flops_counter.py _estimate_deepseek_v3_flops)."""
        if self.is_mla:
            return (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) / 2
        return self.head_dim

    def kv_cache_elems_per_token_per_layer(self, tp: int = 1) -> float:
        """bf16 elements vLLM caches per token and layer on one GPU. GQA: K and V heads split over TP
        (replicated when TP exceeds them). MLA: one latent vector, replicated on every TP rank (vLLM's MLA
        backends cache kv_lora_rank + qk_rope_head_dim per token)."""
        if self.is_mla:
            return float(self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * max(self.num_kv_heads / tp, 1.0) * self.head_dim

    def kv_cache_bytes_per_token(self, tp: int = 1) -> float:
        """bf16 KV cache bytes per token on one GPU, every layer (the model's fact; both the memory model and
        the torch probe's KV pool read it)."""
        return self.num_layers * self.kv_cache_elems_per_token_per_layer(tp) * 2

    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:  # DeepseekV3Attention: q_a/q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj, norms
            q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * q_head
                 if self.q_lora_rank else h * self.num_heads * q_head)
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.num_heads * self.v_head_dim * h
        proj = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        bias += h if self.o_bias else 0
        norm = 2 * self.head_dim if self.qk_norm else 0
        sinks = self.num_heads if self.attn_sinks else 0
        return proj + bias + norm + sinks

    def _moe_layer_params(self, experts: int) -> int:
        h, i = self.hidden_size, self.moe_intermediate_size
        per_expert = 3 * h * i + ((2 * i + h) if self.expert_bias else 0)
        router = h * self.num_experts + (self.num_experts if self.expert_bias or self.router_score_bias else 0)
        return (experts + self.n_shared_experts) * per_expert + router

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense if self.is_moe else 0

    def mlp_params_per_layer(self) -> int:
        """All expert weights of an MoE layer (what must be stored), the SwiGLU MLP for dense."""
        if self.is_moe:
            return self._moe_layer_params(self.num_experts)
        return 3 * self.hidden_size * self.intermediate_size

    def active_mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self._moe_layer_params(self.num_experts_per_tok)
        return self.mlp_params_per_layer()

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def _layers_params(self, moe_mlp: int) -> int:
        norms = 2 * self.hidden_size
        dense_mlp = 3 * self.hidden_size * self.intermediate_size
        dense_layers = self.num_layers - self.moe_layers
        return (self.num_layers * (self.attn_params_per_layer() + norms)
                + dense_layers * dense_mlp + self.moe_layers * moe_mlp)

    def param_count(self) -> int:
        return self._param_counts[0]

    def active_param_count(self) -> int:
        return self._param_counts[1]

    @cached_property
    def _param_counts(self) -> tuple[int, int]:
        """(all, active) parameters, computed once per spec: the fields are frozen, and the memory and cost models
        ask for them ~10^5 times per simulated run (5 of 87 s in a profiled 40-trial `autotune run`)."""
        return (self._layers_params(self.mlp_params_per_layer()) + self.embedding_params() + self.hidden_size,
                self._layers_params(self.active_mlp_params_per_layer()) + self.embedding_params() + self.hidden_size)

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
                     max_position_embeddings=32768, published_params=params, source=f"https://huggingface.co/Qwen/{repo}/blob/main/config.json")


def _qwen3(name, *, h, layers, heads, kv, inter, tie, params, repo):
    return ModelSpec(name=name, hf_id=f"Qwen/{repo}", architecture="Qwen3ForCausalLM", model_type="qwen3",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=128,
                     intermediate_size=inter, vocab_size=151936, tie_word_embeddings=tie, qk_norm=True,
                     max_position_embeddings=40960, published_params=params, source=f"https://huggingface.co/Qwen/{repo}/blob/main/config.json")


def _llama(name, *, h, layers, heads, kv, inter, tie, params, repo):
    return ModelSpec(name=name, hf_id=f"meta-llama/{repo}", architecture="LlamaForCausalLM", model_type="llama",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=h // heads,
                     intermediate_size=inter, vocab_size=128256, tie_word_embeddings=tie,
                     max_position_embeddings=131072, published_params=params, source=f"https://huggingface.co/meta-llama/{repo}/blob/main/config.json")


def _qwen3_moe(name, *, h, layers, heads, kv, moe_inter, experts, topk, params, repo):
    return ModelSpec(name=name, hf_id=f"Qwen/{repo}", architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe",
                     hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=128,
                     intermediate_size=moe_inter * 8, vocab_size=151936, tie_word_embeddings=False, qk_norm=True,
                     num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=moe_inter,
                     max_position_embeddings=40960, published_params=params, source=f"https://huggingface.co/Qwen/{repo}/blob/main/config.json")


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
    # Qwen3 Base checkpoints: same config.json shapes as the post-trained ones (checked field by field)
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B-Base",),
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B-Base",),
    "qwen3-4b": ("Qwen/Qwen3-4B-Base",),
    "qwen3-8b": ("Qwen/Qwen3-8B-Base",),
    "qwen3-14b": ("Qwen/Qwen3-14B-Base",),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B-Base",),
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B",),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B",),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B",),
}


def lookup_table(name: str) -> tuple[ModelSpec, str] | None:
    """The table entry for an autotune key, an HF id or a bare repository name, with the id it matched.

    Exact (case-insensitive) only: "qwen2-7b" is Qwen/Qwen2-7B (an alias with Qwen2.5-7B's shapes), never
    Qwen2.5; the matched id, not the entry's, is what a caller exports.
    """
    key = name.strip().rstrip("/").lower()
    for spec in MODELS.values():
        if key == spec.name:
            return spec, spec.hf_id
        for hf_id in (spec.hf_id, *_ALIASES.get(spec.name, ())):
            if key == hf_id.lower() or key == hf_id.split("/")[-1].lower():
                return spec, hf_id
    return None


def get_model(name: str) -> ModelSpec:
    """The table entry (see lookup_table); a miss lists the choices."""
    found = lookup_table(name)
    if found is None:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(MODELS)} (see `autotune models`)")
    return found[0]


def model_from_identity(identity: dict) -> ModelSpec:
    """The model a stored study was created for: its full spec (config.json models), else the table entry."""
    spec = identity.get("model_spec")
    if spec:
        return ModelSpec(**spec)
    return get_model(identity["model"])
