"""A convnet checkpoint (`configs/teacher_small.yaml`'s teacher: ``backbone: timm``) through the commands that read
checkpoints: predict, export to ONNX and to timm's safetensors layout, and a clear error where a ViT's attention is
needed; and 0.1's `ConvNetClassifier`, kept as that classifier with a DeprecationWarning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import built_once
from tests.helpers import quick_trainer, random_images, tiny_vit
from vit.commands import main, run
from vit.deploy import load_classifier
from vit.errors import UserValueError
from vit.tasks import ImageClassifier
from vit.tasks.convnet import ConvNetClassifier

pytestmark = pytest.mark.usefixtures("one_thread")
DIGITS = [str(i) for i in range(10)]
SHRUNK = {"channels": [8, 16, 32, 64], "stem_width": 8}


def test_the_0_1_convnet_classifier_is_the_classifier_with_a_timm_backbone():
    with pytest.warns(DeprecationWarning, match="ImageClassifier with backbone: timm"):
        old = ConvNetClassifier(model_kwargs=SHRUNK, in_chans=1)
    new = ImageClassifier(backbone="timm", model="resnet10t", img_size=32, model_kwargs=SHRUNK, in_chans=1)
    assert isinstance(old, ImageClassifier) and old.backbone.kind == "timm" and old.hparams.img_size == 32
    assert old.checkpoint_meta() == new.checkpoint_meta()  # what load_classifier reads: the same


@pytest.fixture(scope="module")
def convnet(tmp_path_factory) -> Path:
    """A tiny resnet10t for 1-channel 8x8 images, trained two steps by a Trainer, as `vit fit` saves it."""
    def build(root: Path) -> None:
        g = torch.Generator().manual_seed(0)
        data = DataLoader(TensorDataset(torch.randn(16, 1, 8, 8, generator=g), torch.arange(16) % 10), batch_size=8)
        model = ImageClassifier(backbone="timm", model="resnet10t", model_kwargs=SHRUNK, num_classes=10, in_chans=1,
                                img_size=8, class_names=DIGITS, mean=[0.2], std=[0.4])
        trainer = quick_trainer(root, max_steps=2)
        trainer.fit(model, data)
        trainer.save_checkpoint(root / "convnet.ckpt")
    return built_once(tmp_path_factory, "convnet", build) / "convnet.ckpt"


def test_predict_reads_a_convnet_checkpoint(convnet, tmp_path):
    files = random_images(tmp_path, 3, name="digit{i}.png")
    main(["predict", "--ckpt", str(convnet), *map(str, files), "--out", str(tmp_path / "p.json")])
    records = json.loads((tmp_path / "p.json").read_text())
    classifier = load_classifier(convnet)
    # independently: the pixels normalised by hand (mean 0.2, std 0.4; 8x8 needs no resize), through the network
    x = torch.stack([(torch.from_numpy(np.asarray(Image.open(f), np.float32) / 255) - 0.2) / 0.4 for f in files])
    with torch.no_grad():
        probs = classifier.model(x[:, None]).softmax(-1)
    for record, p in zip(records, probs):
        assert record["top_k"][0]["class"] == int(p.argmax())
        assert record["top_k"][0]["probability"] == pytest.approx(float(p.max()), abs=1e-5)


def test_a_convnet_exports_to_onnx_and_to_timms_layout(convnet, tmp_path):
    classifier = load_classifier(convnet)
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        ours = classifier(x)

    main(["export", "--ckpt", str(convnet), "--format", "safetensors", "--out", str(tmp_path / "st")])
    theirs = timm.create_model(f"local-dir:{tmp_path / 'st'}", pretrained=True).eval()
    assert type(theirs).__name__ == "ResNet"
    assert theirs.pretrained_cfg["label_names"] == DIGITS
    with torch.no_grad():
        assert (theirs(x) - ours).abs().max() <= 1e-5

    import onnxruntime

    main(["export", "--ckpt", str(convnet), "--format", "onnx", "--out", str(tmp_path / "onnx")])
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert np.abs(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0] - ours.numpy()).max() <= 1e-4


def test_attention_on_a_convnet_is_a_clear_error(convnet, tmp_path):
    files = random_images(tmp_path, 1, name="digit{i}.png")
    for argv in (["attention", "--ckpt", str(convnet), str(files[0]), "--out", str(tmp_path / "maps")],
                 ["attention", "--faithfulness", "--ckpt", str(convnet), str(files[0])]):
        with pytest.raises(UserValueError, match=r"resnet10t, a convnet .* need a ViT's attention"):
            run(argv)
    assert not (tmp_path / "maps").exists()


def test_vit_serve_answers_for_a_convnet_and_refuses_its_attention(convnet, tmp_path):
    import asyncio

    from tests.serve.conftest import client_of, make_app
    from vit.deploy import load_classifier
    from vit.deploy.predict import predict_files
    from vit.serve.core import Predictor

    predictor = Predictor(load_classifier(convnet))
    files = random_images(tmp_path, 2, name="digit{i}.png")
    expected = predict_files(predictor.classifier, files, top_k=3)

    async def go():
        async with client_of(make_app(predictor)) as client:
            info = (await client.get("/info")).json()
            answers = [await client.post("/predict", files={"file": (f.name, f.read_bytes())}, params={"top_k": 3})
                       for f in files]
            refused = await client.post("/predict", files={"file": ("x.png", files[0].read_bytes())},
                                        params={"attention": "1"})
        assert info["model"] == "resnet10t" and info["attention"] is False
        for answer, want in zip(answers, expected):
            assert answer.status_code == 200
            assert [e["class"] for e in answer.json()["top_k"]] == [e["class"] for e in want["top_k"]]
        assert refused.status_code == 422 and "ViT" in refused.json()["detail"]
        assert "resnet10t" in refused.json()["detail"]
    asyncio.run(go())


def test_a_convnet_checkpoint_is_no_vits_pretrained_weights(convnet):
    from vit.checkpoints.weights import load_pretrained
    model = tiny_vit(depth=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserValueError, match=r"resnet10t, a convnet .*a ViT's pretrained weights come from a ViT"):
        load_pretrained(model, convnet)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
