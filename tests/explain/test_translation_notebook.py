"""notebooks/translation_attention.ipynb runs top to bottom, offline, on a small trained reversal checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tests.test_notebook import executed, python3_kernel  # noqa: F401 - the kernel-spec fixture

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "translation_attention.ipynb"
# The reversal recipe's best checkpoint (step 1,500 of `vit fit --config configs/translate_reverse.yaml`),
# saved weights-only in float16 (scripts/experiments/reverse_alignment.py --fixture writes it).
FIXTURE = Path(__file__).resolve().parent / "translate_reverse.fp16.pt"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.slow
def test_translation_notebook_executes_and_draws_its_figures(tmp_path, monkeypatch, python3_kernel):  # noqa: F811
    monkeypatch.setenv("VIT_TRANSLATION_CKPT", str(FIXTURE))
    work = tmp_path / "run"
    work.mkdir()
    notebook, outputs = executed(NOTEBOOK, python3_kernel, work, timeout=120)
    figures = [out for out in outputs if "image/png" in out.get("data", {})]
    # alignment, top sources, three layers x heads grids, beam alignment, the explorer's static PNG
    assert len(figures) == 7, f"expected 7 figures, got {len(figures)}"
    printed = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert "'4 1 7 19 3 12 8 0 15' -> '15 0 8 12 3 19 7 1 4' (greedy)" in printed
    best = [float(v) for v in re.findall(r"best head layer \d head \d: ([\d.]+)", printed)]
    assert len(best) == 2 and min(best) >= 0.95, printed
    assert not list(work.iterdir()), "the notebook should not write files"

    # The explorer's output: a widget view with a PNG beside it, and saved widget state that holds its models.
    views = [out["data"] for out in outputs if "application/vnd.jupyter.widget-view+json" in out.get("data", {})]
    assert len(views) == 1 and "image/png" in views[0]
    state = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]
    view = views[0]["application/vnd.jupyter.widget-view+json"]
    assert state["version_major"] == 2 and view["model_id"] in state["state"]
    assert any(m["model_name"] == "ImageModel" for m in state["state"].values())
    nbformat.validate(notebook)  # the executed notebook, widget state included, is valid nbformat
