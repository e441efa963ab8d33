"""`vit export --format hub`: the folder timm (`local-dir:`) and transformers (AutoModelForImageClassification,
pipeline) load with our logits and class names, its model card, `hf-hub:` as a source, and the upload.

Expected values come from timm, transformers and huggingface_hub themselves, and from the run's metrics.csv read
with the csv module here; the upload is checked by the HTTP requests huggingface_hub sends (its httpx2 transport
replaced), not by which function was called.
"""

import csv
import json
from pathlib import Path

import pytest
import timm
import torch
import transformers
from PIL import Image

import vit
from tests.commands.test_export import FAMILIES
from vit.commands import main
from vit.nn.configs import MODEL_CONFIGS


@pytest.fixture(scope="module")
def hub(fitted, tmp_path_factory) -> Path:
    """The `fitted` digits run's best checkpoint exported with --format hub."""
    out = tmp_path_factory.mktemp("hub") / "digits"
    main(["export", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), "--format", "hub", "--out", str(out)])
    return out


def _ours(fitted):
    from vit.deploy import load_classifier

    return load_classifier(next((fitted / "ckpt").glob("best-*.ckpt")))


def _digits(digit_pngs, n=8):
    paths, _ = digit_pngs
    return paths[:n]


def test_timm_local_dir_gives_our_logits_and_class_names(fitted, hub, digit_pngs):
    ours = _ours(fitted)
    theirs = timm.create_model(f"local-dir:{hub}", pretrained=True).eval()
    assert theirs.pretrained_cfg["label_names"] == ours.class_names
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    paths = _digits(digit_pngs)
    # Each side reads the file its own way: ours as grayscale (as vit predict does), timm's as RGB.
    x_ours = torch.stack([ours.eval_transform()(Image.open(p).convert("L")) for p in paths])
    x_timm = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    assert x_timm.shape[1] == 3 and x_ours.shape[1] == 1
    with torch.no_grad():
        torch.testing.assert_close(theirs(x_timm), ours(x_ours), atol=1e-5, rtol=0)


def test_transformers_model_and_pipeline_give_our_logits_and_labels(fitted, hub, digit_pngs):
    ours = _ours(fitted)
    model = transformers.AutoModelForImageClassification.from_pretrained(hub).eval()
    assert model.config.id2label == dict(enumerate(ours.class_names))
    processor = transformers.AutoImageProcessor.from_pretrained(hub)
    paths = _digits(digit_pngs)
    images = [Image.open(p).convert("RGB") for p in paths]
    x_ours = torch.stack([ours.eval_transform()(Image.open(p).convert("L")) for p in paths])
    with torch.no_grad():
        logits = model(**processor(images, return_tensors="pt")).logits
        expected = ours(x_ours)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    classify = transformers.pipeline("image-classification", model=str(hub))
    probabilities = expected.softmax(-1)
    for path, row in zip(paths, probabilities, strict=True):
        answer = classify(str(path), top_k=len(ours.class_names))
        got = {a["label"]: a["score"] for a in answer}
        assert list(got) == [ours.class_names[i] for i in row.argsort(descending=True)]
        assert max(abs(got[name] - p.item()) for name, p in zip(ours.class_names, row, strict=True)) <= 1e-5


def test_vit_predict_reads_the_hub_folder_as_the_checkpoint(fitted, hub, digit_pngs, tmp_path):
    """`vit predict --ckpt DIR` (a hub folder) writes the rows `vit predict --ckpt best.ckpt` writes."""
    folder = _digits(digit_pngs)[0].parent
    main(["predict", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), str(folder), "--out", "a.csv"])
    main(["predict", "--ckpt", str(hub), str(folder), "--out", "b.csv"])
    a, b = (list(csv.DictReader(Path(f).read_text().splitlines())) for f in ("a.csv", "b.csv"))
    assert [r["class_1"] for r in a] == [r["class_1"] for r in b]
    assert max(abs(float(x["prob_1"]) - float(y["prob_1"])) for x, y in zip(a, b, strict=True)) <= 1e-5


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_loads_in_timm_and_transformers(name, tmp_path):
    """Random weights, tiny widths: the hub folder of every ViT family timm builds gives our logits in timm's
    local-dir and in transformers (which builds it through timm)."""
    from vit.deploy.card import RunFacts
    from vit.deploy.classifier import Classifier
    from vit.deploy.hub import export_hub

    p = MODEL_CONFIGS[name]["patch_size"]
    model = vit.create_model(name, img_size=2 * p, depth=1, embed_dim=32, num_heads=2, num_classes=3).eval()
    classifier = Classifier(model, model_name=name, class_names=["cat", "dog", "owl"], mean=[0.5] * 3,
                            std=[0.5] * 3, crop_pct=1.0, interpolation="bicubic")
    export_hub(classifier, RunFacts(tmp_path / "none.ckpt"), tmp_path)
    x = torch.randn(2, 3, 2 * p, 2 * p)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    hf = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(theirs(x), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(hf(pixel_values=x).logits, expected, atol=1e-5, rtol=0)
    assert theirs.pretrained_cfg["label_names"] == ["cat", "dog", "owl"]
    assert hf.config.id2label == {0: "cat", 1: "dog", 2: "owl"}


# ---- the model card --------------------------------------------------------------------------------------------
def test_card_front_matter_validates_and_its_numbers_are_the_runs(fitted, hub):
    from huggingface_hub import ModelCard

    card = ModelCard.load(hub / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "timm" and data["pipeline_tag"] == "image-classification"
    assert "license" not in data and "base_model" not in data  # trained from scratch: nothing to inherit
    rows = list(csv.DictReader((fitted / "logs" / "digits" / "version_0" / "metrics.csv").open()))
    test_acc = float([r["test_acc"] for r in rows if r["test_acc"]][-1])
    val_acc = float([r["val_acc"] for r in rows if r["val_acc"]][-1])  # one epoch: the best checkpoint's
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results["test_acc"] == test_acc and results["test_acc_top5"] > 0
    assert f"test accuracy: {test_acc:.4f}" in card.text and "validation accuracy (epoch 0" in card.text
    assert f"{val_acc:.4f}" in card.text
    assert (hub / "confusion_matrix.png").is_file() and "](confusion_matrix.png)" in card.text
    config_yaml = (fitted / "logs" / "digits" / "version_0" / "config.yaml").read_text()
    assert config_yaml.strip() in card.text
    assert card.text.count("not known to the run") >= 3  # intended use, limits, license, data: left to the user
    assert json.loads((hub / "config.json").read_text())["label_names"] == [str(i) for i in range(10)]


def test_card_of_a_checkpoint_the_run_did_not_test_claims_no_test_accuracy(fitted, tmp_path):
    from huggingface_hub import ModelCard

    main(["export", "--ckpt", str(fitted / "ckpt" / "last.ckpt"), "--format", "hub", "--out", str(tmp_path)])
    card = ModelCard.load(tmp_path / "README.md")
    assert not card.data.eval_results and "not measured on this checkpoint" in card.text
    assert not (tmp_path / "confusion_matrix.png").exists()


def test_card_without_a_run_folder_says_so(fitted, tmp_path):
    import shutil

    ckpt = tmp_path / "alone" / "best.ckpt"
    ckpt.parent.mkdir()
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "README.md").read_text()
    assert "No `vit fit` run folder was found" in text and "test accuracy" not in text.split("## Results")[1][:300]


@pytest.mark.parametrize("tag", ["vit_base_patch16_224.mae", "vit_base_patch16_clip_224.metaclip_2pt5b",
                                 "vit_small_patch16_dinov3.lvd1689m", "vit_base_patch16_siglip_224.webli"])
def test_license_and_base_model_come_from_the_base_weights(tag):
    from huggingface_hub import ModelCardData
    from timm.models import get_pretrained_cfg

    from vit.deploy.card import base_weights

    cfg = get_pretrained_cfg(tag)
    found = base_weights(tag)
    assert found["base_model"] == cfg.hf_hub_id
    if cfg.license in ("cc-by-nc-4.0", "apache-2.0"):  # Hub identifiers
        assert found["license"] == cfg.license
    else:  # DINOv3's own terms: the Hub's "other", named
        assert found["license"] == "other" and found["license_name"] == cfg.license
    data = ModelCardData(license=found["license"], base_model=found["base_model"])
    assert data.to_dict()["license"] == found["license"]
    assert base_weights(None) == {} and base_weights("weights/some_file.safetensors") == {}
