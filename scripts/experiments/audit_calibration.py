"""Calibrate `vit audit` on real folders with planted problems: near-duplicates, then label issues.

    python scripts/experiments/audit_calibration.py --work /tmp/audit_cal                # both parts, about 15 minutes
    python scripts/experiments/audit_calibration.py --work /tmp/audit_cal --part duplicates

Duplicates: each folder of `audit_folders.py` (digits, MNIST, scikit-image tiles, sample-photo tiles, objects on
plain backgrounds) is written twice, with copies planted and with nothing planted, and `vit audit --no_labels`
runs on each. Per folder: the recall of the planted cross-split pairs; the false pairs (reported across splits,
not planted, and correlating below 0.9 at 32x32 grayscale: plainly different pictures), per 1,000 images; and
every other reported pair that was not planted.

Labels: scikit-learn's digits split in two disjoint parts, a "pretrain" part (40%) and the audited part (60%,
64-px PNGs), 5% of the audited training labels flipped. Backbones: untrained (random initialisation), barely
trained (`vit fit` for 1 epoch on the pretrain part) and trained (``--epochs``). For each: the out-of-fold
accuracy and balanced accuracy beside chance, the skill `vit.audit.labels.trust` judges by, and the flagged
images' precision and recall on the flips, and the recall of the flips among the top 2K of the ranking.
Also the objects folder with its labels flipped and an untrained backbone (issue 26's case).
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
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [str(i) for i in range(10)]
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
    root: {root}
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


def fit_backbone(work: Path, epochs: int) -> Path:
    """`vit fit` on the pretrain part for ``epochs``; returns the last checkpoint."""
    config = work / f"pretrain_{epochs}.yaml"
    config.write_text(CONFIG.format(work=work / f"run_{epochs}", epochs=epochs, root=work / "pretrain"))
    subprocess.run([sys.executable, "-m", "vit", "fit", "--config", str(config)], check=True)
    return max((work / f"run_{epochs}" / "runs" / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)


def label_figures(work: Path, root: Path, weights: Path | None, flipped: list[dict], *extra: str) -> dict:
    """Out-of-fold accuracy beside chance, the trust verdict, flagged precision and recall, recall@2K."""
    from threadpoolctl import threadpool_limits

    from vit.audit.labels import confident_learning, out_of_fold_probabilities, trust
    from vit.cli.main import build_model_and_data
    from vit.features import cached_features

    config = work / "untrained.yaml"
    config.write_text(CONFIG.format(work=work / "run_0", epochs=0, root=root))
    module, data, _ = build_model_and_data([
        "--config", str(config), "--model.init_args.pretrained", str(weights) if weights else "null", *extra],
        "calibration")
    data.setup("fit")
    train = data.eval_split("train")
    features, labels, _ = cached_features(module.eval_model.eval(), module.model_config, train, "train",
                                          cache_dir=work / "cache")
    x, y = features.numpy().astype(np.float64), labels.numpy()
    with threadpool_limits(1, user_api="blas"):
        probabilities = out_of_fold_probabilities(x, y, len(data.class_names))
    found, verdict = confident_learning(probabilities, y), trust(probabilities, y)
    names = [train.item_name(i) for i in range(len(train))]
    wrong = {f["path"] for f in flipped}
    flagged = {names[i] for i in np.flatnonzero(found.flagged)}
    top = {names[i] for i in found.ranking[: 2 * len(wrong)]}
    return {**{k: verdict[k] for k in ("accuracy", "balanced_accuracy", "chance_accuracy", "chance_balanced_accuracy",
                                       "skill", "trusted")},
            "flipped": len(wrong), "flagged": len(flagged), "flagged_precision": round(len(flagged & wrong) /
                                                                                      max(1, len(flagged)), 3),
            "flagged_recall": round(len(flagged & wrong) / len(wrong), 3),
            "recall_at_2k": round(len(top & wrong) / len(wrong), 3)}


def flip_labels(root: Path, fraction: float, seed: int) -> list[dict]:
    """Move ``fraction`` of root/train's images to another class's folder; returns the flips."""
    rng = np.random.default_rng(seed)
    files = sorted((root / "train").glob("*/*.png"))
    classes = sorted(p.name for p in (root / "train").iterdir())
    flipped = []
    for i in rng.choice(len(files), round(fraction * len(files)), replace=False):
        source = files[int(i)]
        wrong = rng.choice([c for c in classes if c != source.parent.name])
        target = root / "train" / wrong / source.name
        source.rename(target)
        flipped.append({"path": str(target), "true": source.parent.name, "given": str(wrong)})
    return flipped


def duplicate_figures(root: Path, out: Path, planted: list[dict]) -> dict:
    """`vit audit --no_labels` on ``root``: recall of the planted cross-split pairs, false pairs, the rest."""
    from vit.audit.verify import plain_correlation, thumbnail
    from vit.commands import run

    started = time.perf_counter()
    summary = run(["audit", "--model", "vit.tasks.ImageClassifier", "--model.init_args.model", "vit_tiny_patch16_224",
                   "--data", "vit.data.ImageFolder", "--data.root", str(root), "--data.num_workers", "0",
                   "--out", str(out), "--no_labels"])
    seconds = time.perf_counter() - started
    rows = list(csv.DictReader((out / "duplicates.csv").read_text().splitlines()))
    cross = {(r["path_a"], r["path_b"]): r for r in rows if r["split_a"] != r["split_b"]}
    truth = {(p["copy"], p["original"]) for p in planted}
    found = truth & set(cross)
    other = [cross[k] for k in set(cross) - truth]
    plain = [plain_correlation(thumbnail(Image.open(r["path_a"])), thumbnail(Image.open(r["path_b"]))) for r in other]
    false = [r for r, c in zip(other, plain) if c < 0.9]
    images = summary["inventory"]["images"]
    return {"images": images, "planted": len(truth), "found": len(found),
            "recall": round(len(found) / len(truth), 3) if truth else None,
            "false_pairs": len(false), "false_per_1000": round(1000 * len(false) / images, 2),
            "other_reported": len(other), "candidates": summary["duplicates"]["candidates"],
            "within_split": summary["duplicates"]["within_split"], "audit_s": round(seconds, 1),
            "missed": sorted(truth - found), "false": [(r["path_a"], r["path_b"], r["score"]) for r in false]}


def duplicates_part(work: Path, folders: list[str], seeds: list[int], clean: bool = True) -> dict:
    """Each calibration folder, planted (once per seed: which images are copied, and how) and clean."""
    from audit_folders import FOLDERS, write_folder

    figures = {}
    for name in folders:
        items = FOLDERS[name]()
        runs = [(True, seed) for seed in seeds] + ([(False, seeds[0])] if clean else [])
        for planted_too, seed in runs:
            tag = f"planted_seed{seed}" if planted_too and len(seeds) > 1 else "planted" if planted_too else "clean"
            root = work / "duplicates" / f"{name}_{tag}"
            shutil.rmtree(root, ignore_errors=True)
            planted = write_folder(root, items, plant=planted_too, seed=seed)
            figures[root.name] = duplicate_figures(root, work / "duplicates" / f"audit_{root.name}", planted)
            print(root.name, {k: v for k, v in figures[root.name].items() if k not in ("missed", "false")}, flush=True)
    return figures


def labels_part(work: Path, epochs: int) -> dict:
    """The digits under untrained, barely trained and trained backbones; the objects folder untrained."""
    from audit_folders import objects, write_folder

    flipped = build_digits(work)
    figures = {"digits, untrained": label_figures(work, work / "digits", None, flipped)}
    for n, name in ((1, "barely trained (1 epoch)"), (epochs, f"trained ({epochs} epochs)")):
        figures[f"digits, {name}"] = label_figures(work, work / "digits", fit_backbone(work, n), flipped)
    root = work / "objects_labels"
    shutil.rmtree(root, ignore_errors=True)
    write_folder(root, objects(), plant=False)
    figures["objects, untrained"] = label_figures(
        work, root, None, flip_labels(root, 0.05, 0), "--model.init_args.model", "vit_tiny_patch16_224",
        "--model.init_args.model_kwargs", "{depth: 2, embed_dim: 64, num_heads: 2, patch_size: 8}",
        "--data.init_args.img_size", "32")
    for name, f in figures.items():
        print(name, f, flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="an empty folder for the data, runs and audits")
    parser.add_argument("--part", choices=("duplicates", "labels", "both"), default="both")
    parser.add_argument("--epochs", type=int, default=40, help="the trained backbone's epochs (default: %(default)s)")
    parser.add_argument("--folders", default="digits,mnist,skimage,sample,objects",
                        help="duplicates: the folders of audit_folders.py to audit (default: %(default)s)")
    parser.add_argument("--seeds", default="0", help="duplicates: planting seeds, e.g. 0,1,2 (default: %(default)s)")
    parser.add_argument("--no_clean", action="store_true", help="duplicates: skip the folders with nothing planted")
    args = parser.parse_args()
    from audit_folders import FOLDERS

    unknown = sorted(set(args.folders.split(",")) - set(FOLDERS))
    if unknown:
        parser.error(f"--folders: no folder named {', '.join(unknown)}; choose from {', '.join(FOLDERS)}")
    if not all(s.strip().isdigit() for s in args.seeds.split(",")):
        parser.error(f"--seeds: comma-separated whole numbers, e.g. 0,1,2; got {args.seeds!r}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    figures = {}
    if args.part in ("duplicates", "both"):
        figures["duplicates"] = duplicates_part(work, args.folders.split(","),
                                                [int(s) for s in args.seeds.split(",")], not args.no_clean)
    if args.part in ("labels", "both"):
        figures["labels"] = labels_part(work, args.epochs)
    (work / f"figures_{args.part}.json").write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
