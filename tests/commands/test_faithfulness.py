"""`vit attention --faithfulness`: deletion/insertion AUCs and the randomisation check on a checkpoint and a folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tests.commands.test_attention import write_checkpoint
from tests.helpers import TINY_DIM
from vit.commands import run


def test_faithfulness_writes_aucs_and_correlations(tmp_path, capsys, monkeypatch):
    import vit.commands.faithfulness as faithfulness
    from vit.files import save_atomic

    written = []  # every file goes through save_atomic: a kill leaves the old file or the new one
    monkeypatch.setattr(faithfulness, "save_atomic",
                        lambda write, path: written.append(path) or save_atomic(write, path))
    ckpt = tmp_path / "digits.ckpt"
    write_checkpoint(ckpt, num_classes=10, mean=(0.5,), std=(0.5,),
                     model_kwargs=dict(embed_dim=TINY_DIM, depth=2, num_heads=4))
    folder = tmp_path / "digits"
    folder.mkdir()
    for i in range(6):
        pixels = (np.random.default_rng(i).random((8, 8)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    result = run(["attention", "--faithfulness", "--ckpt", str(ckpt), str(folder), "--out", str(tmp_path / "out"),
                  "--max_images", "5"])
    assert result["images"] == 5
    saved = json.loads((tmp_path / "out" / "faithfulness.json").read_text())
    assert written == [tmp_path / "out" / "faithfulness.json"] == list((tmp_path / "out").iterdir())
    assert set(saved["deletion_insertion_auc"]) == {"cls attention", "rollout", "grad rollout"}
    assert len(saved["randomisation_spearman"]["rollout"]) == 3  # head, then 2 blocks
    printed = capsys.readouterr().out
    assert "random order" in printed and "head + blocks 0..1" in printed


@pytest.mark.slow
def test_rollout_beats_a_random_order_on_the_trained_digits_model(digits_run, digit_pngs, tmp_path, capsys):
    paths, _ = digit_pngs
    result = run(["attention", "--faithfulness", "--ckpt", str(digits_run.best), str(paths[0].parent),
                  "--out", str(tmp_path), "--max_images", "359"])
    print(capsys.readouterr().out)  # the table, for docs/attention.md (pytest -s shows it)
    rollout = result["deletion_insertion_auc"]["rollout"]
    assert rollout["MoRF deletion"] < rollout["random deletion"] < rollout["LeRF deletion"]
    assert rollout["insertion"] > rollout["random insertion"]
    correlations = result["randomisation_spearman"]["rollout"]
    assert correlations[-1] < correlations[0]  # the maps decorrelate as the blocks go random
