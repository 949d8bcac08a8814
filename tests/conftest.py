"""Shared test set-up: GPU tests are skipped without a GPU, verl-config tests without verl's configs."""

from __future__ import annotations

import importlib.util

import pytest


def _has_gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _has_verl_configs() -> bool:
    return importlib.util.find_spec("verl") is not None and importlib.util.find_spec("hydra") is not None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_verl = pytest.mark.skip(reason="needs verl's Hydra configs: pip install --no-deps verl==0.9.1 hydra-core")
    has_gpu = None
    has_verl = _has_verl_configs()
    for item in items:
        if "gpu" in item.keywords:
            has_gpu = _has_gpu() if has_gpu is None else has_gpu
            if not has_gpu:
                item.add_marker(skip_gpu)
        if "verl" in item.keywords and not has_verl:
            item.add_marker(skip_verl)


@pytest.fixture
def out_dir(tmp_path):
    return tmp_path / "out"
