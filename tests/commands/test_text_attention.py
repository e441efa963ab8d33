"""`vit attention --text` (alignment PNG + weights JSON) and `vit translate --alignment` on a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tests.helpers import TINY_DIM, quick_trainer
from vit.commands import run as main
from vit.data.translation import SyntheticTranslationDataModule
from vit.tasks.translate import Translator


@pytest.fixture(scope="module")
def translate_ckpt(tmp_path_factory):
    """A briefly trained tiny reversal checkpoint written by Lightning, as `vit fit` writes one."""
    root = tmp_path_factory.mktemp("translate")
    dm = SyntheticTranslationDataModule(task="reverse", num_train=256, num_val=16, num_test=16, min_len=3,
                                        max_len=5, num_symbols=8, batch_size=32)
    dm.setup("fit")
    torch.manual_seed(0)
    model = Translator(dm.tokenizers, embed_dim=TINY_DIM, num_heads=2, num_encoder_layers=1, num_decoder_layers=2)
    trainer = quick_trainer(root, max_steps=2, limit_val_batches=0)
    trainer.fit(model, dm)
    path = root / "translate.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_attention_text_writes_the_alignment_png_and_the_weights_json(translate_ckpt, tmp_path, capsys):
    out = tmp_path / "maps"
    records = main(["attention", "--ckpt", str(translate_ckpt), "--text", "1 2 3", "4 5 6 7", "--out", str(out),
                    "--heads", "decoder", "--head", "1"])
    assert [r["text"] for r in records] == ["1 2 3", "4 5 6 7"]
    for n in range(2):
        assert Image.open(out / f"{n}_alignment.png").size[0] > 100
        assert (out / f"{n}_decoder_heads.png").is_file()
    saved = json.loads((out / "attention.json").read_text())
    first = saved[0]
    assert first["source"] == ["1", "2", "3"] and first["mode"] == "greedy"
    L_dec, H, T, S = (len(first["cross"]), len(first["cross"][0]), len(first["cross"][0][0]),
                      len(first["cross"][0][0][0]))
    assert (L_dec, H, S) == (2, 2, 3) and T == len(first["target"]) == len(first["target_inputs"])
    assert len(first["encoder"]) == 1 and len(first["decoder"][0][0][0]) == T
    assert all(abs(sum(row) - 1) < 1e-5 for row in first["cross"][1][0])  # softmax rows
    assert "wrote 2 alignment figure(s)" in capsys.readouterr().out
    forced = main(["attention", "--ckpt", str(translate_ckpt), "--text", "1 2 3", "--target", "3 2 1",
                   "--out", str(out)])
    assert forced[0]["target"] == ["3", "2", "1", "<eos>"] and forced[0]["mode"] == "teacher forcing"


def test_attention_text_writes_every_file_atomically(translate_ckpt, tmp_path, monkeypatch):
    """A kill while a figure or attention.json is written leaves the old file or the new one, never half."""
    import vit.commands.text_attention as text_attention
    from vit.files import save_atomic

    written = []
    monkeypatch.setattr(text_attention, "save_atomic",
                        lambda write, path: written.append(path) or save_atomic(write, path))
    out = tmp_path / "maps"
    main(["attention", "--ckpt", str(translate_ckpt), "--text", "1 2 3", "--out", str(out), "--heads", "cross"])
    assert sorted(written) == sorted(out.iterdir()) == [out / "0_alignment.png", out / "0_cross_heads.png",
                                                        out / "attention.json"]


def test_attention_text_errors_name_the_option(translate_ckpt, tmp_path):
    common = ["attention", "--ckpt", str(translate_ckpt), "--text", "1 2", "--out", str(tmp_path)]
    with pytest.raises(ValueError, match="--head 5: the model has 2 heads"):
        main([*common, "--head", "5"])
    with pytest.raises(ValueError, match="--layer 3: the decoder has 2 layers"):
        main([*common, "--layer", "3"])
    with pytest.raises(SystemExit):
        main([*common, "--target", "a", "b"])


def test_translate_prints_the_alignment_under_each_translation(translate_ckpt, capsys):
    plain = main(["translate", "--ckpt", str(translate_ckpt), "1 2 3", "4 5"])
    capsys.readouterr()
    aligned = main(["translate", "--ckpt", str(translate_ckpt), "--alignment", "--alignment_top", "2", "1 2 3", "4 5"])
    assert aligned == plain  # the same translations
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == plain[0]
    assert all(" <- " in line and line.startswith("    ") for line in lines[1 : lines.index(plain[1])])
    assert lines[1].count("(") == 2  # two source tokens with their weights
