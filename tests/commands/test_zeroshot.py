"""`vit zeroshot` writes a checkpoint that `vit predict`, `export` (ONNX) and `attention` take; --eval scores a
folder; mistakes end in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.openclip import tiny_openclip, write_openclip_folder
from vit.commands import main


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("zsc")
    model, cfg = tiny_openclip()
    folder = write_openclip_folder(model, cfg, root / "clip")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / "eval" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "eval" / name / f"{i}.png")
    (root / "t.txt").write_text("a photo of a {}.\n")
    main(["zeroshot", "--model", str(folder), "--classes", "cat,dog", "--templates", str(root / "t.txt"),
          "--out", str(root / "zs"), "--eval", str(root / "eval")])
    return root, model


def test_predict_gives_open_clips_probabilities(made):
    import open_clip

    root, model = made
    main(["predict", "--ckpt", str(root / "zs" / "zeroshot.ckpt"), str(root / "eval"), "--out", str(root / "p.json")])
    prep = open_clip.image_transform(32, is_train=False)
    text = model.encode_text(open_clip.get_tokenizer("ViT-B-32")(["a photo of a cat.", "a photo of a dog."]),
                             normalize=True)
    for row in json.loads((root / "p.json").read_text()):
        with torch.no_grad():
            image = model.encode_image(prep(Image.open(row["path"])).unsqueeze(0), normalize=True)
            want = dict(zip(["cat", "dog"], (model.logit_scale.exp() * image @ text.T).softmax(-1)[0].tolist()))
        for entry in row["top_k"]:
            assert abs(entry["probability"] - want[entry.get("name") or entry["class"]]) < 1e-4


def test_onnx_export_agrees_and_attention_runs(made):
    import onnxruntime

    from vit.deploy import load_classifier

    root, _ = made
    ckpt = str(root / "zs" / "zeroshot.ckpt")
    main(["export", "--ckpt", ckpt, "--format", "onnx", "--out", str(root / "onnx")])
    session = onnxruntime.InferenceSession(str(root / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(6, 3, 32, 32)
    with torch.no_grad():
        want = load_classifier(ckpt)(x)
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    main(["attention", "--ckpt", ckpt, str(root / "eval" / "cat" / "0.png"), "--out", str(root / "maps")])
    assert any((root / "maps").iterdir())


def test_mistakes_end_in_one_line(made, tmp_path, capsys):
    root, _ = made
    bad = tmp_path / "bad.txt"
    bad.write_text("a photo\n")
    for args, message in ((["--classes", " , "], "class list is empty"),
                          (["--classes", "a,b", "--templates", str(bad)], "exactly one {}"),
                          (["--classes", "a,b", "--tokenizer", str(tmp_path)], "no tokenizer file")):
        with pytest.raises(SystemExit):
            main(["zeroshot", "--model", str(root / "clip"), *args, "--out", str(tmp_path / "o")])
        assert message in capsys.readouterr().err
