"""notebooks/attention_maps.ipynb runs top to bottom, offline, and draws its figures."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "attention_maps.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, "the notebook has no code cells"
    assert all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.fixture
def python3_kernel(tmp_path, monkeypatch):
    """A "python3" kernel spec that runs this interpreter, whatever the machine has installed."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.parent.mkdir(parents=True)
    write_kernel_spec(str(spec_dir))  # argv: [sys.executable, "-m", "ipykernel_launcher", ...]
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # searched before system dirs
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] == sys.executable
    return "python3"


def executed(path: Path, kernel: str, folder: Path, timeout: int = 300) -> tuple[nbformat.NotebookNode, list]:
    """Run a notebook in ``folder`` (as Jupyter would, opened from there): the executed notebook and its code
    cells' outputs. A failing cell raises CellExecutionError with its traceback; no output may be an error."""
    notebook = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(folder)}}
    NotebookClient(notebook, kernel_name=kernel, timeout=timeout, resources=resources).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    return notebook, outputs


@pytest.mark.slow
def test_attention_notebook_executes_and_draws_its_figures(tmp_path, monkeypatch, python3_kernel):
    monkeypatch.setenv("VIT_NOTEBOOK_FAST", "1")  # fewer training steps; same code path
    monkeypatch.delenv("VIT_ATTENTION_CKPT", raising=False)
    work = tmp_path / "run"
    work.mkdir()
    _, outputs = executed(NOTEBOOK, python3_kernel, work)
    figures = [out for out in outputs if "image/png" in out.get("data", {})]
    # digit layers x heads, digit rollouts, 2 photo grids, random vs trained, distance, rollout by depth, registers
    assert len(figures) >= 8, f"expected at least 8 figures, got {len(figures)}"
    printed = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert re.search(r"test accuracy on \d+ held-out digits: [\d.]+%", printed)
    assert "china.jpg: P(china)" in printed and "flower.jpg: P(china)" in printed
    assert "plain: 1 prefix token(s)" in printed and "4 registers: 5 prefix token(s); maps (4, 2, 4, 12, 18)" in printed
    assert not list(work.iterdir()), "the notebook should not write files"


@pytest.mark.slow
def test_attention_notebook_explains_a_digits_checkpoint_given_from_the_repository_root(fitted, tmp_path, monkeypatch,
                                                                                        python3_kernel):
    """VIT_ATTENTION_CKPT with the README's digits recipe (16x16 inputs, not the notebook's own 8x8 model), as a
    path typed from the repository root while Jupyter runs the notebook in notebooks/."""
    import shutil

    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "logs" / "digits").mkdir(parents=True)
    shutil.copy(fitted / "ckpt" / "last.ckpt", repo / "logs" / "digits" / "last.ckpt")  # a tiny digits run's
    monkeypatch.setenv("VIT_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("VIT_ATTENTION_CKPT", "logs/digits/last.ckpt")
    _, outputs = executed(NOTEBOOK, python3_kernel, repo / "notebooks")
    printed = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert "test accuracy on 359 held-out digits" in printed  # vit.data.Digits' test split, at 16x16
    assert "attention weights: (1, 8, 2, 17, 17)" in printed  # the checkpoint's model: 1 layer, 2 heads, 4x4 grid

