"""`vit zeroshot` writes a checkpoint that `vit predict`, `serve`, `export` (ONNX; timm's format refused),
`attention`, `probe` and `calibrate` take; --eval scores a folder; mistakes end in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.openclip import tiny_openclip, write_openclip_folder
from vit.commands import main, run


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("zsc")
    model, cfg = tiny_openclip()
    folder = write_openclip_folder(model, cfg, root / "clip")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / "eval" / name).mkdir(parents=True)
        for i in range(8):
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


def open_clip_logits(model, paths) -> torch.Tensor:
    """open_clip's own zero-shot logits of the fixture's two classes (one template) for image files."""
    import open_clip

    prep = open_clip.image_transform(32, is_train=False)
    with torch.no_grad():
        text = model.encode_text(open_clip.get_tokenizer("ViT-B-32")(["a photo of a cat.", "a photo of a dog."]),
                                 normalize=True)
        images = model.encode_image(torch.stack([prep(Image.open(p)) for p in paths]), normalize=True)
        return model.logit_scale.exp() * images @ text.T


def test_serve_answers_what_vit_predict_writes(made, tmp_path):
    from tests.serve.conftest import client_of, make_app
    from tests.serve.test_app import assert_same_top_k
    from tests.serve.test_app import run as run_async
    from vit.deploy import load_classifier
    from vit.serve.core import Predictor

    root, _ = made
    ckpt = str(root / "zs" / "zeroshot.ckpt")
    paths = sorted((root / "eval").rglob("*.png"))
    rows = run(["predict", "--ckpt", ckpt, *map(str, paths), "--out", str(tmp_path / "p.json")])

    async def go():
        async with client_of(make_app(Predictor(load_classifier(ckpt)))) as client:
            for path, want in zip(paths, rows):
                response = await client.post("/predict", content=path.read_bytes(),
                                             headers={"Content-Type": "image/png"})
                assert response.status_code == 200, response.text
                assert_same_top_k(response.json()["top_k"], want["top_k"], 1e-5)
    run_async(go())


def test_timm_format_export_is_refused_naming_onnx(made, tmp_path, capsys):
    root, _ = made
    for fmt in ("safetensors", "hub"):
        with pytest.raises(SystemExit):
            main(["export", "--ckpt", str(root / "zs" / "zeroshot.ckpt"), "--format", fmt, "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert "normalised" in err and "--format onnx" in err and "Traceback" not in err, err
        assert not list(tmp_path.iterdir())


def test_probe_reads_it_as_a_backbone_of_open_clips_embeddings(made, tmp_path):
    """The probe's features are the zero-shot model's normalised image embeddings: its checkpoint carries them."""
    from vit.deploy import load_classifier

    root, model = made
    config = torch.load(root / "zs" / "zeroshot.ckpt", weights_only=False)["vit"]["model_config"]
    kwargs = {k: config[k] for k in ("depth", "embed_dim", "num_heads", "patch_size", "proj_dim",
                                     "normalize_embedding")}
    result = run(["probe", "--model", "vit.tasks.ImageClassifier", "--model.init_args.model",
                  "vit_base_patch16_clip_224", "--model.init_args.model_kwargs", json.dumps(kwargs),
                  "--model.init_args.pretrained", str(root / "zs" / "zeroshot.ckpt"),
                  "--data", "vit.data.ImageFolder", "--data.root", str(root / "eval"), "--data.img_size", "32",
                  "--data.num_workers", "0", "--data.val_fraction", "0.25", "--data.test_fraction", "0.25",
                  "--seed_everything", "0", "--no_cache", "--C", "1", "--k", "1", "--out", str(tmp_path / "p.ckpt")])
    import open_clip

    probe = load_classifier(result["checkpoint"])
    paths = sorted((root / "eval").rglob("*.png"))[:3]
    prep = open_clip.image_transform(32, is_train=False)
    x = torch.stack([prep(Image.open(p)) for p in paths])
    with torch.no_grad():
        got = probe.model.forward_head(probe.model.forward_features(x), pre_logits=True)
        torch.testing.assert_close(got, model.encode_image(x, normalize=True), atol=1e-4, rtol=0)


def test_calibrate_stores_a_temperature_that_predict_divides_by(made, tmp_path):
    import shutil

    root, model = made
    ckpt = tmp_path / "cal.ckpt"
    shutil.copy(root / "zs" / "zeroshot.ckpt", ckpt)
    (tmp_path / "data.yaml").write_text(json.dumps({"data": {"class_path": "vit.data.ImageFolder", "init_args": {
        "root": str(root / "eval"), "img_size": 32, "num_workers": 0, "val_fraction": 0.5}}}))
    stored = run(["calibrate", "--ckpt", str(ckpt), "--config", str(tmp_path / "data.yaml"),
                  "--model", "vit.tasks.ImageClassifier"])
    assert stored["temperature"] != 1.0
    paths = sorted((root / "eval").rglob("*.png"))
    rows = run(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.json"), "--accept_all"])
    want = (open_clip_logits(model, paths) / stored["temperature"]).softmax(-1)
    for row, probs in zip(rows, want.tolist()):
        assert row["answer"] == row["top_k"][0]["name"]  # --accept_all: the top class
        for entry in row["top_k"]:
            assert abs(entry["probability"] - probs[entry["class"]]) < 1e-4


def test_mistakes_end_in_one_line(made, tmp_path, capsys):
    root, _ = made
    bad = tmp_path / "bad.txt"
    bad.write_text("a photo\n")
    for args, message in ((["--classes", " , "], "class list is empty"),
                          (["--classes", "cat"], "one class, 'cat': a zero-shot classifier chooses among at least two"),
                          (["--classes", "cat,"], "one class, 'cat'"),
                          (["--classes", "a,b", "--templates", str(bad)], "exactly one {}"),
                          (["--classes", "a,b", "--tokenizer", str(tmp_path)], "no tokenizer file")):
        with pytest.raises(SystemExit):
            main(["zeroshot", "--model", str(root / "clip"), *args, "--out", str(tmp_path / "o")])
        assert message in capsys.readouterr().err


def test_zeroshot_reads_class_names_from_the_option_or_a_file(tmp_path):
    from vit.commands.zeroshot import parse_args, read_classes

    base = ["--model", "m", "--out", str(tmp_path / "out")]
    assert read_classes(parse_args([*base, "--classes", "oak,maple birch"])) == ["oak", "maple birch"]
    (tmp_path / "names.txt").write_text("oak\nmaple birch\n", encoding="utf-8")
    assert read_classes(parse_args([*base, "--classes_file", str(tmp_path / "names.txt")])) == ["oak", "maple birch"]
    with pytest.raises(SystemExit):
        parse_args(base)  # neither
