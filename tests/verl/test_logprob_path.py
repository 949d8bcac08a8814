"""Which log-prob path verl takes (autotune/verl/logprob_path.py), judged by verl's own import-time check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

from autotune.verl.logprob_path import DISABLE_FLASH_CE_ENV, flash_ce_installed, takes_logprob_loop


def _fake_flash_attn(root, *, with_ce: bool):
    pkg = root / "flash_attn"
    (pkg / "ops" / "triton").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "__init__.py").write_text("")
    if with_ce:  # the one name verl imports from it (utils/torch_functional.py:35)
        (pkg / "ops" / "triton" / "cross_entropy.py").write_text("def cross_entropy_loss(*a, **k):\n    raise "
                                                                 "NotImplementedError\n")
    return root


def _both_views(path_entry) -> tuple[bool, bool]:
    """(autotune's reading, verl's FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE) in a fresh interpreter."""
    code = ("import json; from autotune.verl.logprob_path import flash_ce_installed; "
            "import verl.utils.torch_functional as tf; "
            "print(json.dumps([flash_ce_installed(), tf.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(path_entry or ""), os.environ.get("PYTHONPATH", ""))
                                                       if p)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.verl
@pytest.mark.parametrize("with_ce", [None, False, True])
def test_autotune_reads_the_node_as_verl_does(tmp_path, with_ce):
    root = None if with_ce is None else _fake_flash_attn(tmp_path, with_ce=with_ce)
    ours, verls = _both_views(root)
    assert ours == verls == bool(with_ce)


def test_the_loop_is_the_verl_backend_on_a_node_without_flash_ce(monkeypatch, tmp_path):
    monkeypatch.delenv(DISABLE_FLASH_CE_ENV, raising=False)
    monkeypatch.setattr("autotune.verl.logprob_path.flash_ce_installed", lambda: False)
    assert takes_logprob_loop("verl", {}, probes_here=True)
    assert not takes_logprob_loop("verl", {}, probes_here=False)  # probes elsewhere: verl's documented install
    assert not takes_logprob_loop("torch", {}, probes_here=True)  # the torch probe's own log-prob is vectorised
    assert not takes_logprob_loop("sim", {}, probes_here=True)
    monkeypatch.setattr("autotune.verl.logprob_path.flash_ce_installed", lambda: True)
    assert not takes_logprob_loop("verl", {}, probes_here=True)
    # the job's own switch forces the loop wherever verl runs (utils/torch_functional.py:95)
    assert takes_logprob_loop("verl", {DISABLE_FLASH_CE_ENV: "1"}, probes_here=True)
    assert takes_logprob_loop("sim", {DISABLE_FLASH_CE_ENV: 1}, probes_here=False)
    assert not takes_logprob_loop("verl", {DISABLE_FLASH_CE_ENV: "0"}, probes_here=True)


@pytest.mark.skipif(find_spec("flash_attn") is not None, reason="flash-attn is installed here")
def test_this_machine_has_no_flash_attn_and_the_check_imports_nothing():
    before = set(sys.modules)
    assert flash_ce_installed() is False
    assert not any(m.startswith("flash_attn") for m in set(sys.modules) - before)
