"""notebooks/analysis.ipynb runs top to bottom (nbclient) on a small simulated study and shows its results."""

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"
STUDY = "qwen2.5-1.5b-1x8-sim"


def _outputs(cell) -> tuple[str, list[str], list[bytes]]:
    """(stream + plain text, html, png images) of one executed cell."""
    text, htmls, pngs = [], [], []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            text.append(out["text"])
        data = out.get("data", {})
        text.append(data.get("text/plain", ""))
        if "text/html" in data:
            htmls.append(data["text/html"])
        if "image/png" in data:
            pngs.append(base64.b64decode(data["image/png"]))
    return "".join(text), htmls, pngs


def test_analysis_notebook_runs_on_a_simulated_study(tmp_path, monkeypatch):
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-1.5b", "--gpus", "8",
                           "--backend", "sim", "--trials", "12", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("AUTOTUNE_STORAGE_URL", f"sqlite:///{out / 'autotune.db'}")  # the kernel inherits it
    monkeypatch.delenv("AUTOTUNE_STUDY", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not any(o["output_type"] == "error" for o in c.get("outputs", [])) for c in code)
    text = "\n".join(_outputs(c)[0] for c in code)
    htmls = [h for c in code for h in _outputs(c)[1]]
    pngs = [p for c in code for p in _outputs(c)[2]]

    assert f"study {STUDY}: qwen2.5-1.5b on 1 node(s) x 8 H200, backend sim" in text
    assert "SIMULATED: every number below comes from autotune's calibrated model" in text
    assert "12 trials" in text
    try:
        import pandas  # noqa: F401
        table = next(h for h in htmls if "tokens/s/GPU" in h)
        assert len(re.findall(r"<tr>\s*<th>\d+</th>", table)) == 12  # one row per trial
    except ImportError:
        assert len(re.findall(r"^\d+ +\w", text, re.M)) >= 12
    assert re.search(r"best: trial \d+, \d+ tokens/s/GPU \(SIMULATED\)", text)
    assert re.search(r"speedup: x\d+\.\d\d", text)
    assert re.search(r"trial 0 \(verl default\): gen \d+\.\d s", text)
    assert re.search(r"\d+ trial\(s\) without a result", text)
    assert len(pngs) >= 3 and all(p[:4] == b"\x89PNG" for p in pngs)  # phases, importances, history
