"""The bound of benchmarks/layout_rank.py: an idealised search's probes, and a random order's chance."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from layout_rank import model_order, pair_probes, random_order_success  # noqa: E402


def test_random_order_chance_is_hypergeometric():
    assert random_order_success(30, 1, 15) == pytest.approx(0.5)
    assert random_order_success(30, 0, 15) == 0.0
    assert random_order_success(10, 2, 10) == 1.0
    assert random_order_success(4, 1, 1) == pytest.approx(0.25)


def test_pair_probes_needs_both_parts_probed_and_pairs_them_for_free():
    truth = {("a", "x"): 1.0, ("b", "y"): 0.9, ("b", "x"): 0.5}
    layouts, settings = ["b", "a"], ["y", "x"]
    assert pair_probes(truth, layouts, settings, 0.85) == 1
    assert pair_probes(truth, layouts, settings, 0.95) == 2  # a and x are each second in the model's order
    assert pair_probes(truth, layouts, settings, 1.5) is None


def test_model_order_ranks_each_part_by_its_best_pairing():
    predicted = {("a", "x"): 3.0, ("b", "y"): 2.0, ("b", "x"): 4.0, ("a", "y"): 1.0}
    assert model_order(predicted, 0) == ["b", "a"]
    assert model_order(predicted, 1) == ["x", "y"]
