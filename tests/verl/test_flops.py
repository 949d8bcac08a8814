import pytest

from autotune.models import get_model
from autotune.verl.flops import forward_flops, mfu, train_flops, train_flops_uniform, verl_dense_n


def test_qwen25_7b_matches_verls_worked_example():
    # reference/verl.md section 3: dense_N = 7.615e9, 45.7 GFLOP/token + ~0.92 GFLOP attention at s=1536
    m = get_model("qwen2.5-7b")
    assert verl_dense_n(m) == pytest.approx(7.615e9, rel=1e-3)
    per_token = train_flops(m, [1536]) / 1536
    assert per_token == pytest.approx(6 * 7.615e9 + 6 * 1536 * 128 * 28 * 28, rel=1e-3)
    assert per_token / 1e9 == pytest.approx(45.7 + 0.92, abs=0.05)


def test_formula_by_hand_for_a_dense_model():
    m = get_model("qwen2.5-0.5b")
    h, d, L = m.hidden_size, m.head_dim, m.num_layers
    attn_linear = h * (m.num_heads * d + 2 * m.num_kv_heads * d + m.num_heads * d)
    dense_n = (h * m.intermediate_size * 3 + attn_linear) * L + m.vocab_size * h * 2
    seqs = [100, 300]
    expected = 6 * dense_n * 400 + 6 * (100**2 + 300**2) * d * m.num_heads * L
    assert train_flops(m, seqs) == expected
    assert forward_flops(m, seqs) == expected / 3
    assert train_flops_uniform(m, 2, 200) == train_flops(m, [200, 200])
    # lengths that vary: attention counts each one's square, so the mean of the squares, not the mean's square
    assert train_flops_uniform(m, 2, 200, (100**2 + 300**2) / 2) == pytest.approx(expected)


def test_moe_counts_routed_experts_and_router_only():
    m = get_model("qwen3-30b-a3b")
    h = m.hidden_size
    moe = h * m.num_experts_per_tok * m.moe_intermediate_size * 3 + h * m.num_experts
    attn = h * (m.num_heads * m.head_dim * 2 + 2 * m.num_kv_heads * m.head_dim)
    assert verl_dense_n(m) == (moe + attn) * m.num_layers + m.vocab_size * h * 2


def test_mfu_and_its_guards():
    assert mfu(989e12, 1.0, 1, 989e12) == pytest.approx(1.0)
    assert mfu(989e12 * 8 * 0.4, 1.0, 8, 989e12) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="seconds=0"):
        mfu(1.0, 0, 1, 1.0)
