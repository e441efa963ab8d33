"""Measure `vit audit` with planted problems: leakage recall and false pairs, label-issue recall and precision.

    python scripts/audit_digits.py --work /tmp/audit_digits [--timing]     # about 5 minutes on 2 CPU cores

1. Splits scikit-learn's 1,797 digits in two disjoint parts, seeded: a "pretrain" part (40%) and the audited
   part (60%), written as 64x64 grayscale PNGs (8x8 upsampled bicubically) in class folders; 5% of the audited
   training labels are flipped (the files moved to another class's folder).
2. Trains a backbone with `vit fit` on the pretrain part alone (a user's pretrained model: it never saw
   an audited image).
3. Leakage, on real photos: 128x128 tiles of scikit-image's photos (one class per photo), split 70/10/20, with
   30 test tiles planted in train as near-copies (resized 0.9x, a 2-pixel crop on every side, brightness +5%,
   saved as JPEG quality 70: all four at once) and 10 as exact copies under other names. (The 8x8 digits are no
   test of near-duplicate search: many different digits are closer to each other, pixel for pixel, than a
   cropped copy is to its original.)
4. Runs `vit audit` on both with the trained backbone and scores its outputs against what was planted: the
   cross-split recall of the 40 planted pairs and the number of other cross-split pairs (false pairs); the
   recall of the flipped images among the top 2K of the label ranking (K = number flipped), and the precision
   and recall of the flagged set.

`--timing` also times `vit audit` (a subprocess, imports included) on a 2,000-image folder (all the digits
plus 203 planted copies), first with an empty feature cache, then cached.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

ROOT = Path(__file__).resolve().parents[1]
CLASSES = [str(i) for i in range(10)]
PHOTOS = ("astronaut", "brick", "camera", "chelsea", "clock", "coffee", "coins", "grass", "gravel", "hubble_deep_field",
          "immunohistochemistry", "moon", "retina", "rocket", "cell")
CONFIG = """\
seed_everything: 0
num_threads: 1
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: {epochs}
  enable_progress_bar: false
  default_root_dir: {work}/runs
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {{save_dir: {work}/runs, name: pretrain}}
checkpoint:
  dirpath: {work}/runs/checkpoints
model:
  class_path: vit.tasks.ImageClassifier
  init_args:
    model: vit_digits_patch4_16
    lr: 0.004
    warmup_epochs: 3
    ema_decay: 0.995
data:
  class_path: vit.data.ImageFolder
  init_args:
    root: {work}/pretrain
    img_size: 16
    batch_size: 64
    num_workers: 0
    auto_augment: null
    hflip: 0.0
    re_prob: 0.0
    color_jitter: 0.0
    scale: [0.7, 1.0]
    crop_pct: 1.0
"""


def digit_image(pixels: np.ndarray, side: int = 64) -> Image.Image:
    """An 8x8 digit (0..16) as a ``side`` x ``side`` 8-bit grayscale image, upsampled bicubically."""
    return Image.fromarray((pixels * (255 / 16)).round().astype(np.uint8)).resize((side, side), Image.BICUBIC)


def near_copy(img: Image.Image, path: Path) -> None:
    """Resize 0.9x, crop 2 pixels from every side, brighten 5%, save as JPEG quality 70."""
    w, h = img.size
    img = img.resize((round(0.9 * w), round(0.9 * h)), Image.BICUBIC)
    img = img.crop((2, 2, img.width - 2, img.height - 2))
    ImageEnhance.Brightness(img).enhance(1.05).save(path, quality=70)


def write_split(folder: Path, images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> dict[int, Path]:
    """PNG files folder/<class>/d<id>.png; returns id -> path."""
    paths = {}
    for pixels, label, i in zip(images, labels, ids):
        path = folder / CLASSES[label] / f"d{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        digit_image(pixels).save(path)
        paths[int(i)] = path
    return paths


def build_digits(work: Path, seed: int = 0) -> list[dict]:
    """The pretrain and audited digits folders, 5% of the audited training labels flipped; returns the flips."""
    from sklearn.datasets import load_digits

    from vit.data.io import stratified_split

    digits = load_digits()
    rest, pretrain = stratified_split(digits.target, [0.4], seed)
    pre_train, pre_val = stratified_split(digits.target[pretrain], [0.15], seed + 2)
    for split, idx in (("train", pretrain[pre_train]), ("val", pretrain[pre_val])):
        write_split(work / "pretrain" / split, digits.images[idx], digits.target[idx], idx)
    paths = {}
    for split, idx in zip(("train", "val", "test"), stratified_split(digits.target[rest], [0.1, 0.2], seed + 1)):
        ids = rest[idx]
        paths[split] = write_split(work / "digits" / split, digits.images[ids], digits.target[ids], ids)
    rng = np.random.default_rng(seed)
    flipped = []
    train_ids = sorted(paths["train"])
    for i in rng.choice(train_ids, round(0.05 * len(train_ids)), replace=False):
        source = paths["train"][int(i)]
        label = int(source.parent.name)
        wrong = (label + int(rng.integers(1, 10))) % 10
        target = work / "digits" / "train" / CLASSES[wrong] / source.name
        source.rename(target)
        flipped.append({"path": str(target), "true": label, "given": wrong})
    return flipped


def build_photos(work: Path, seed: int = 0) -> list[dict]:
    """The photos folder: 128x128 tiles (non-overlapping, not flat) of scikit-image's photos, one class per
    photo, split 70/10/20; 30 test tiles planted in train as near-copies, 10 as exact copies under other names.
    Returns the planted (train copy, test original) pairs."""
    import skimage.data

    rng = np.random.default_rng(seed)
    root = work / "photos"
    test = []
    for name in PHOTOS:
        pixels = np.asarray(Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB"))
        h, w = pixels.shape[:2]
        tiles = [pixels[y:y + 128, x:x + 128] for y in range(0, h - 127, 128) for x in range(0, w - 127, 128)]
        tiles = [tiles[i] for i in rng.permutation(len(tiles)) if tiles[i].std() >= 12]  # flat tiles all look alike
        for k, tile in enumerate(tiles):
            split = "train" if k % 10 < 7 else "val" if k % 10 == 7 else "test"
            path = root / split / name / f"{name}_{k:03d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(tile).save(path)
            if split == "test":
                test.append(path)
    planted = []
    for n, i in enumerate(rng.permutation(len(test))[:40]):
        source = test[i]
        if n < 30:
            copy = root / "train" / source.parent.name / f"copy{n:02d}.jpg"
            near_copy(Image.open(source), copy)
        else:
            copy = root / "train" / source.parent.name / f"renamed{n:02d}.png"
            shutil.copyfile(source, copy)
        planted.append({"train": str(copy), "test": str(source), "kind": "near" if n < 30 else "exact"})
    return planted


def fit_backbone(work: Path, epochs: int) -> Path:
    """`vit fit` on the pretrain part; returns the best checkpoint."""
    config = work / "pretrain.yaml"
    config.write_text(CONFIG.format(work=work, epochs=epochs))
    subprocess.run([sys.executable, "-m", "vit", "fit", "--config", str(config)], check=True)
    return max((work / "runs" / "checkpoints").glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)


def audit(work: Path, root: Path, ckpt: Path, out: Path, cache: Path, *extra: str) -> float:
    """`vit audit` as a user runs it; returns its wall time in seconds."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vit", "audit", "--config", str(work / "pretrain.yaml"),
                    "--data.init_args.root", str(root), "--model.init_args.pretrained", str(ckpt),
                    "--out", str(out), "--cache_dir", str(cache), *extra], check=True)
    return time.perf_counter() - started


def leakage_figures(out: Path, planted: list[dict]) -> dict:
    """Cross-split recall of the planted pairs, and the other cross-split pairs (false pairs)."""
    rows = list(csv.DictReader((out / "duplicates.csv").read_text().splitlines()))
    cross = {(r["path_a"], r["path_b"]) for r in rows if r["split_a"] != r["split_b"]}
    truth = {(p["train"], p["test"]) for p in planted}
    found = truth & cross
    return {"planted_pairs": len(truth), "cross_split_pairs": len(cross), "found": len(found),
            "recall": round(len(found) / len(truth), 3), "false_pairs": len(cross - truth),
            "missed": sorted(truth - cross), "false": sorted(cross - truth)}


def label_figures(work: Path, out: Path, ckpt: Path, flipped: list[dict]) -> dict:
    """Recall of the flipped images among the top 2K of the ranking, and precision and recall of the flagged set."""
    flagged = {r["path"] for r in csv.DictReader((out / "label_issues.csv").read_text().splitlines())}
    wrong = {f["path"] for f in flipped}
    k = len(wrong)
    top = set(label_ranking(work, ckpt)[: 2 * k])
    return {"flipped": k, "recall_at_2k": round(len(top & wrong) / k, 3), "flagged": len(flagged),
            "flagged_recall": round(len(flagged & wrong) / k, 3),
            "flagged_precision": round(len(flagged & wrong) / max(1, len(flagged)), 3)}


def label_ranking(work: Path, ckpt: Path) -> list[str]:
    """The audit's full ranking of the training images (its CSV holds the flagged ones only), recomputed through
    the same functions, seed and (cached) features."""
    from vit.audit.labels import confident_learning, out_of_fold_probabilities
    from vit.cli import build_model_and_data
    from vit.features import cached_features

    module, data, _ = build_model_and_data(["--config", str(work / "pretrain.yaml"), "--data.init_args.root",
                                            str(work / "digits"), "--model.init_args.pretrained", str(ckpt)], "score")
    data.setup("fit")
    train = data.eval_split("train")
    features, labels, _ = cached_features(module.eval_model.eval(), module.model_config, train, "train",
                                          cache_dir=work / "cache")
    probabilities = out_of_fold_probabilities(features.numpy().astype(np.float64), labels.numpy(), 10)
    found = confident_learning(probabilities, labels.numpy())
    return [train.item_name(int(i)) for i in found.ranking]


def timing_folder(work: Path) -> Path:
    """2,000 images: all 1,797 digits in train/val/test, and 203 near copies of training images."""
    from sklearn.datasets import load_digits

    from vit.data.io import stratified_split

    digits = load_digits()
    root = work / "two_thousand"
    parts = stratified_split(digits.target, [0.1, 0.2], 0)
    paths = {}
    for split, idx in zip(("train", "val", "test"), parts):
        paths.update(write_split(root / split, digits.images[idx], digits.target[idx], idx))
    for n, i in enumerate(parts[0][:203]):
        near_copy(Image.open(paths[int(i)]), paths[int(i)].with_name(f"copy{n:03d}.jpg"))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="an empty folder for the data, runs and audits")
    parser.add_argument("--epochs", type=int, default=40, help="backbone training epochs (default: %(default)s)")
    parser.add_argument("--timing", action="store_true", help="also time the audit of 2,000 images")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    flipped, planted = build_digits(work), build_photos(work)
    (work / "planted.json").write_text(json.dumps({"flipped": flipped, "planted": planted}, indent=1))
    ckpt = fit_backbone(work, args.epochs)
    figures = {"photos_audit_s": round(audit(work, work / "photos", ckpt, work / "audit_photos", work / "cache",
                                             "--no_labels"), 1)}
    figures.update(leakage_figures(work / "audit_photos", planted))
    figures["digits_audit_s"] = round(audit(work, work / "digits", ckpt, work / "audit_digits", work / "cache"), 1)
    figures.update(label_figures(work, work / "audit_digits", ckpt, flipped))
    if args.timing:
        root = timing_folder(work)
        figures["two_thousand_uncached_s"] = round(audit(work, root, ckpt, work / "audit2k", work / "cache2k"), 1)
        figures["two_thousand_cached_s"] = round(audit(work, root, ckpt, work / "audit2k", work / "cache2k"), 1)
    (work / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps({k: v for k, v in figures.items() if k not in ("missed", "false")}, indent=1))
    print("missed:", figures["missed"], "\nfalse pairs:", figures["false"])


if __name__ == "__main__":
    main()
