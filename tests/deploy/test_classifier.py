"""The input card (`vit.deploy.classifier.ModelInput`): one owner of how an image is read for a model, for each
channel count, and the same card whichever engine holds it."""

from __future__ import annotations

import math

import pytest
import torch

import vit
from tests.helpers import TINY_DIM
from vit.deploy.classifier import CARD_KEYS, Classifier, ModelInput


def classifier(in_chans: int, crop_pct: float = 0.875) -> Classifier:
    model = vit.create_model("vit_digits_patch2_8", in_chans=in_chans, num_classes=3, depth=1)
    return Classifier(model, model_name="vit_digits_patch2_8", class_names=["a", "b", "c"], mean=[0.5] * in_chans,
                      std=[0.25] * in_chans, crop_pct=crop_pct, interpolation="bilinear")


@pytest.mark.parametrize(("in_chans", "mode"), [(1, "L"), (3, "RGB"), (2, "RGB")])
def test_the_image_mode_follows_the_channels(in_chans, mode):
    # 1 channel decodes grey; 3 (and any other count, which the transform then folds) decode RGB
    assert classifier(in_chans).image_mode == mode


@pytest.mark.parametrize("crop_pct", [0.875, 1.0, 0.5])
def test_the_eval_resize_is_the_crop_over_crop_pct(crop_pct):
    # timm resizes the short side to floor(img_size / crop_pct), then crops img_size; the decode scale needs a
    # bound of it, so the card rounds up
    model = classifier(3, crop_pct)
    assert model.eval_short_side() == math.ceil(8 / crop_pct)
    assert model.eval_short_side(1.0) == 8  # an explicit crop_pct wins over the card's


def test_the_transform_gives_the_models_input():
    from PIL import Image

    model = classifier(1)
    x = model.eval_transform()(Image.new("L", (20, 12), 191))
    assert x.shape == (1, 8, 8)
    assert torch.allclose(x, torch.full_like(x, (191 / 255 - 0.5) / 0.25), atol=1e-6)


def test_the_card_round_trips_through_plain_values():
    model = classifier(3)
    card = model.card()
    assert sorted(card) == sorted(CARD_KEYS)
    other = ModelInput()
    other.set_card({k: v for k, v in card.items()})
    assert other.card() == card
    assert (other.image_mode, other.eval_short_side(), other.mean) == ("RGB", 10, (0.5, 0.5, 0.5))


def test_a_lora_checkpoint_is_read_merged_by_export_predict_serve_probe_and_attention(lora_run, tmp_path):
    """A DoRA checkpoint holds adapters and head alone; every command reads it merged into plain timm layers, and
    each output equals the task's own unmerged evaluation (1e-5), or timm's and onnxruntime's (1e-4)."""
    import asyncio
    import json

    import numpy as np
    import onnxruntime
    import timm
    from PIL import Image
    from safetensors.torch import load_file

    from tests.conftest import short_digits_run
    from tests.helpers import random_images
    from tests.serve.conftest import client_of, make_app
    from vit.commands import main, run
    from vit.deploy.classifier import read_classifier
    from vit.nn.lora import LoraLinear, is_adapter
    from vit.serve.core import Predictor
    from vit.tasks import ImageClassifier

    ckpt = lora_run["ckpt"]
    saved = torch.load(ckpt, weights_only=True)
    assert not any(k.endswith("qkv.weight") for k in saved["state_dict"])  # no backbone inside
    classifier = read_classifier(ckpt)
    assert not any(isinstance(m, LoraLinear) for m in classifier.model.modules())
    images = random_images(tmp_path / "images", 3, size=(16, 16), name="digit{i}.png")
    x = torch.stack([classifier.eval_transform()(Image.open(p)) for p in images])
    task = ImageClassifier.load_from_checkpoint(ckpt).eval()  # unmerged, the EMA weights
    assert any(isinstance(m, LoraLinear) for m in task.eval_model.modules())
    with torch.no_grad():
        want = classifier(x)
        torch.testing.assert_close(want, task(x), rtol=1e-5, atol=1e-5)

    main(["export", "--ckpt", str(ckpt), "--format", "safetensors", "--out", str(tmp_path / "st")])
    hub = timm.create_model(f"local-dir:{tmp_path / 'st'}", pretrained=True).eval()  # timm loads strictly
    main(["export", "--ckpt", str(ckpt), "--format", "onnx", "--int8", "dynamic", "--out", str(tmp_path / "onnx")])
    assert (tmp_path / "onnx" / "model.int8.onnx").is_file()
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        assert (hub(x) - want).abs().max() <= 1e-4
    assert np.abs(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0] - want.numpy()).max() <= 1e-4

    main(["export", "--ckpt", str(ckpt), "--format", "adapters", "--out", str(tmp_path / "ad")])
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert config["targets"] == ["q", "k", "v", "proj", "fc1", "fc2"] and config["rank"] == 4 and config["dora"]
    assert config["base"]["sha256"] == saved["vit"]["lora"]["base"]["sha256"]
    assert all(is_adapter(k) or k.startswith("head.") for k in load_file(tmp_path / "ad" / "adapters.safetensors"))

    main(["predict", "--ckpt", str(ckpt), *map(str, images), "--out", str(tmp_path / "p.json")])
    records = json.loads((tmp_path / "p.json").read_text())
    assert [r["top_k"][0]["class"] for r in records] == want.argmax(-1).tolist()

    async def served() -> list[int]:
        async with client_of(make_app(Predictor(classifier))) as client:
            answers = [await client.post("/predict", content=p.read_bytes(), headers={"Content-Type": "image/png"})
                       for p in images]
        return [a.json()["top_k"][0]["class"] for a in answers]

    assert asyncio.run(served()) == want.argmax(-1).tolist()
    main(["attention", "--ckpt", str(ckpt), str(images[0]), "--out", str(tmp_path / "maps")])
    assert (tmp_path / "maps" / "digit0.png").is_file()
    result = run(["probe", *short_digits_run(tmp_path / "probe")[:2], f"--model.init_args.pretrained={ckpt}",
                  f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}",
                  "--data.init_args.num_workers=0", "--no_cache", "--C", "1", "--k", "1",
                  "--out", str(tmp_path / "pr.ckpt")])
    assert result["logistic_val_acc"] > 0.1
