import pytest

from autotune.errors import ConfigError
from autotune.models import MODELS, get_model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_entry_is_consistent(name):
    m = MODELS[name]
    assert m.name == name and m.source.startswith("https://")
    assert m.num_heads % m.num_kv_heads == 0, "GQA groups must be whole"
    assert m.head_dim * m.num_heads in (m.hidden_size, m.q_dim)
    assert m.num_layers > 0 and m.vocab_size > 100_000
    if m.is_moe:
        assert 0 < m.num_experts_per_tok <= m.num_experts and m.moe_intermediate_size > 0
        assert m.active_param_count() < m.param_count() / 5
    else:
        assert m.active_param_count() == m.param_count()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_matches_the_published_one(name):
    m = MODELS[name]
    assert m.param_count() == pytest.approx(m.published_params, rel=0.02)


def test_exact_counts_for_the_calibration_shapes():
    # torch counted these on the H200 (autotune/data/h200-train-probe.json "params")
    assert get_model("qwen2.5-1.5b").param_count() == 1_543_714_304
    assert get_model("qwen2.5-7b").param_count() == 7_615_616_512


def test_lookup_by_name_and_hf_id_is_case_insensitive():
    assert get_model("Qwen2.5-7B").name == "qwen2.5-7b"
    assert get_model("Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"
    assert get_model("qwen/qwen3-30b-a3b").is_moe


def test_unknown_model_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown model 'gpt-5'.*qwen2.5-7b"):
        get_model("gpt-5")
