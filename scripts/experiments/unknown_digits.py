"""Held-out classes as "unknown": train on the digits 0-4, score the digits 5-9, for every candidate score.

    flock /tmp/vit-heavy.lock python scripts/experiments/unknown_digits.py --work /tmp/unknown --seeds 0 1 2

scikit-learn's digits 0-4 are written as 32x32 PNGs, split 60/20/20 (stratified, split seed 0) and `vit fit`
trains ``--config`` (configs/scratch_small.yaml, hflip off) on them, once per training seed. The best checkpoint's
pooled features (the ones `vit probe` reads) of train/val/test 0-4 and of all 5-9 (and of their mirrors, for TTA on
the score) go through each score below;
higher = more unknown. The threshold accepts 95% of val; "rejected" is the share of 5-9 above it, "acc@95" the
accuracy on the accepted test 0-4. AUROC and FPR at 95% TPR are on test 0-4 against 5-9 (unknown = positive).
Writes ``--work``/results.json and prints a markdown table (docs/confidence.md holds it).
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
KNOWN = range(5)


def write_folder(root: Path, side: int = 32) -> tuple[dict[str, list[Path]], list[Path]]:
    """root/{train,val,test}/<digit>/*.png for 0-4 (60/20/20), root/unknown/*.png for 5-9; their paths."""
    from sklearn.datasets import load_digits

    from vit.data.io import stratified_split

    digits = load_digits()
    known = np.flatnonzero(digits.target < 5)
    parts = stratified_split(digits.target[known], [0.2, 0.2], 0)  # train, val, test positions in `known`
    splits = {name: known[idx] for name, idx in zip(("train", "val", "test"), parts)}
    splits["unknown"] = np.flatnonzero(digits.target >= 5)
    paths: dict[str, list[Path]] = {}
    for name, ids in splits.items():
        paths[name] = []
        for i in ids:
            folder = root / name / (str(digits.target[i]) if name != "unknown" else "")
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"d{i}.png"
            if not path.exists():
                pixels = (digits.images[i] * (255 / 16)).round().astype(np.uint8)
                Image.fromarray(pixels).resize((side, side), Image.BICUBIC).save(path)
            paths[name].append(path)
    return paths, list(splits["unknown"])


def other_unknowns(root: Path, side: int = 32) -> dict[str, list[Path]]:
    """Unknowns of another kind: the 360 test tiles of scikit-image's photos and textures (small_folders.py's
    "tiles"), and 100 uniform-noise plus 20 flat images."""
    sys.path.insert(0, str(ROOT / "scripts" / "experiments"))
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


def train(config: str, root: Path, run: Path, seed: int, epochs: int | None, hflip: bool = False) -> Path:
    """`vit fit` on root/train,val,test; the best checkpoint."""
    args = [sys.executable, "-m", "vit", "fit", "--config", str(ROOT / config), "--data.init_args.root", str(root),
            "--data.init_args.hflip", str(0.5 if hflip else 0.0), "--data.init_args.num_workers", "0",
            "--seed_everything", str(seed), "--calibrate", "false",  # measured here, by hand
            "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(run),
            "--checkpoint.dirpath", str(run / "checkpoints")]
    if epochs:
        args += ["--trainer.max_epochs", str(epochs)]
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    if not best:
        subprocess.run(args, check=True, cwd=ROOT)
        best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    return best[-1]


@torch.no_grad()
def features(classifier, paths: list[Path], mirror: bool = False) -> dict[str, np.ndarray]:
    """Logits, the pooled pre-logits features and every block's mean patch token, for ``paths`` (``mirror``: of
    their horizontal mirrors, for TTA on the score)."""
    transform = classifier.eval_transform()
    model = classifier.model
    x = torch.stack([transform(Image.open(p).convert(classifier.image_mode)) for p in paths])
    x = x.flip(-1) if mirror else x
    blocks: list[torch.Tensor] = []
    tokens = model.tokens(x, on_block=lambda i, t: blocks.append(t[:, model.num_prefix_tokens:].mean(1)))
    pooled = model.forward_head(tokens, pre_logits=True)
    out = {"logits": model.head(pooled), "pooled": pooled}
    out.update({f"block{i}": b for i, b in enumerate(blocks)})
    return {k: v.double().numpy() for k, v in out.items()}


def l2(z: np.ndarray) -> np.ndarray:
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def mahalanobis(train: np.ndarray, labels: np.ndarray, relative: bool = False, shrink: float = 0.0,
                per_class: float = 0.0):
    """The class-conditional score with one shared covariance (Lee et al. 2018): min over classes of the squared
    distance; ``relative``: minus the distance to one Gaussian of all training features (Ren et al. 2021);
    ``shrink``: the covariance shrunk towards tr/D times the identity (as `vit.deploy.calibration.fit_layer`);
    ``per_class`` > 0: each class its own covariance, shrunk by that share towards the shared one (Friedman's
    regularised discriminant analysis, as `fit_layer(per_class=True)`)."""
    means = np.stack([train[labels == c].mean(0) for c in KNOWN])
    centred = train - means[labels]
    cov = centred.T @ centred / len(train)
    cov = (1 - shrink) * cov + shrink * np.trace(cov) / len(cov) * np.eye(len(cov))
    if per_class:
        own = [centred[labels == c].T @ centred[labels == c] / (labels == c).sum() for c in KNOWN]
        precisions = np.stack([np.linalg.inv((1 - per_class) * o + per_class * cov) for o in own])
    else:
        precisions = np.stack([np.linalg.pinv(cov)] * len(KNOWN))
    mu0 = train.mean(0)
    precision0 = np.linalg.pinv(np.cov(train - mu0, rowvar=False, bias=True))

    def score(z: np.ndarray) -> np.ndarray:
        d = z[:, None, :] - means[None]
        dist = np.einsum("ncd,cde,nce->nc", d, precisions, d)
        if relative:
            d0 = z - mu0
            dist = dist - np.einsum("nd,de,ne->n", d0, precision0, d0)[:, None]
        return dist.min(1)
    return score


def knn(train: np.ndarray, k: int = 10):
    """Minus the cosine similarity to the k-th nearest training feature (Sun et al. 2022)."""
    bank = l2(train)
    return lambda z: -np.sort(l2(z) @ bank.T, axis=1)[:, -k]


def scores(f: dict[str, dict[str, np.ndarray]], labels: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Each score on each split (higher = more unknown)."""
    from scipy.special import logsumexp, softmax

    layers = sorted(k for k in f["train"] if k.startswith("block"))
    fitted = {
        "max softmax": lambda s: -softmax(s["logits"], 1).max(1),
        "energy": lambda s: -logsumexp(s["logits"], 1),
        "max logit": lambda s: -s["logits"].max(1),
        "kNN cosine, k=10": (lambda g: lambda s: g(s["pooled"]))(knn(f["train"]["pooled"])),
        "Mahalanobis": (lambda g: lambda s: g(s["pooled"]))(mahalanobis(f["train"]["pooled"], labels)),
        "Mahalanobis, L2-normalised": (lambda g: lambda s: g(l2(s["pooled"])))(
            mahalanobis(l2(f["train"]["pooled"]), labels)),
        "Mahalanobis, L2, shrunk 1%": (lambda g: lambda s: g(l2(s["pooled"])))(
            mahalanobis(l2(f["train"]["pooled"]), labels, shrink=0.01)),
        "Mahalanobis, L2, shrunk 0.1%": (lambda g: lambda s: g(l2(s["pooled"])))(
            mahalanobis(l2(f["train"]["pooled"]), labels, shrink=0.001)),
        "relative Mahalanobis": (lambda g: lambda s: g(s["pooled"]))(
            mahalanobis(f["train"]["pooled"], labels, relative=True)),
    }
    # several layers: each block's L2-normalised Mahalanobis, standardised on val, summed (Lee et al. 2018's ensemble)
    per_layer = {k: mahalanobis(l2(f["train"][k]), labels) for k in [*layers, "pooled"]}
    stats = {k: (g(l2(f["val"][k])).mean(), g(l2(f["val"][k])).std()) for k, g in per_layer.items()}
    fitted["Mahalanobis, L2, all layers"] = lambda s: sum(
        (g(l2(s[k])) - stats[k][0]) / stats[k][1] for k, g in per_layer.items())
    shrunk = {k: mahalanobis(l2(f["train"][k]), labels, shrink=0.001) for k in [*layers, "pooled"]}
    loc = {k: (g(l2(f["val"][k])).mean(), g(l2(f["val"][k])).std()) for k, g in shrunk.items()}
    fitted["every layer, shared covariance"] = lambda s: sum(
        (g(l2(s[k])) - loc[k][0]) / loc[k][1] for k, g in shrunk.items())
    # vit's default: the same layers, each class its own covariance shrunk 10% towards the shared one
    own = {k: mahalanobis(l2(f["train"][k]), labels, shrink=0.001, per_class=0.1) for k in [*layers, "pooled"]}
    own_loc = {k: (g(l2(f["val"][k])).mean(), g(l2(f["val"][k])).std()) for k, g in own.items()}
    fitted["every layer, covariance per class (vit's default)"] = lambda s: sum(
        (g(l2(s[k])) - own_loc[k][0]) / own_loc[k][1] for k, g in own.items())
    # the default plus the energy score, standardised on val alike (logits carry what the features' distance misses?)
    energy = lambda s: -logsumexp(s["logits"], 1)
    e_loc = (energy(f["val"]).mean(), energy(f["val"]).std())
    fitted["default + energy"] = lambda s: fitted["every layer, shared covariance"](s) + \
        (energy(s) - e_loc[0]) / e_loc[1]
    if "mirror" in f["train"]:  # TTA on the score: the mean of the image's and its mirror's default score
        fitted["default, TTA flip (mean with the mirror's)"] = lambda s: (
            fitted["every layer, shared covariance"](s)
            + fitted["every layer, shared covariance"](s["mirror"])) / 2
    fitted["Mahalanobis, L2, last 2 blocks + pooled"] = lambda s: sum(
        (g(l2(s[k])) - stats[k][0]) / stats[k][1] for k, g in per_layer.items() if k in (*layers[-2:], "pooled"))
    return {name: {split: g(s) for split, s in f.items()} for name, g in fitted.items()}


def measure(s: dict[str, np.ndarray], test_correct: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import roc_auc_score

    inside, outside = s["test"], s["unknown"]
    auroc = roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(outside))], np.r_[inside, outside])
    fpr95 = float((outside <= np.quantile(inside, 0.95)).mean())  # unknowns accepted where 95% of test is
    threshold = np.quantile(s["val"], 0.95, method="higher")
    accepted = inside <= threshold
    others = {f"rejected_{k}": float((v > threshold).mean()) for k, v in s.items() if k in ("tiles", "noise")}
    others |= {f"auroc_{k}": float(roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(v))], np.r_[inside, v]))
               for k, v in s.items() if k in ("tiles", "noise")}
    return {"auroc": float(auroc), "fpr95": fpr95, "rejected": float((outside > threshold).mean()),
            "test_accepted": float(accepted.mean()), "acc_accepted": float(test_correct[accepted].mean()), **others}


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
    ckpt = train(args.config, root, args.work / f"{folder}_seed{seed}", seed, None, hflip=folder == "tiles")
    from vit.deploy.classifier import read_classifier

    classifier = read_classifier(ckpt)
    paths = {k: sorted((root / k).rglob("*.png")) for k in ("val", "test")}
    names = classifier.class_names
    labels = {k: np.array([names.index(p.parent.name) for p in v]) for k, v in paths.items()}
    f = {k: features(classifier, v) for k, v in paths.items()}
    return calibration(f, labels), (f["test"]["logits"], labels["test"])


def table(results: dict[str, dict]) -> None:
    print("\n| score | AUROC 5-9 (mean ± sd) | FPR@95%TPR | 5-9 rejected @95% val | acc on accepted "
          "| tiles rejected | noise/flat rejected |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for score, per_seed in results.items():
        col = {m: np.array([r[m] for r in per_seed.values()]) for m in next(iter(per_seed.values()))}
        pct = lambda m, col=col: f"{100 * col[m].mean():.0f}% ± {100 * col[m].std():.0f}"
        print(f"| {score} | {col['auroc'].mean():.3f} ± {col['auroc'].std():.3f} | {col['fpr95'].mean():.2f} | "
              f"{pct('rejected')} | {col['acc_accepted'].mean():.3f} | {pct('rejected_tiles')} | "
              f"{pct('rejected_noise')} |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/unknown_digits"))
    parser.add_argument("--config", default="configs/scratch_small.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's max_epochs")
    parser.add_argument("--figure", type=Path, default=None, help="write the reliability diagrams here (PNG)")
    parser.add_argument("--calibration_folders", nargs="*", choices=("tiles", "mnist5k"), default=["tiles", "mnist5k"],
                        help="small folders to fit the recipe on for ECE before and after T (none: skip)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    from vit.deploy.classifier import read_classifier

    paths, _ = write_folder(args.work / "data")
    paths |= other_unknowns(args.work / "unknowns")
    labels = {k: np.array([int(p.parent.name) for p in paths[k]]) for k in ("train", "val", "test")}
    results: dict[str, dict] = {}
    calibrated: dict[str, dict] = {}
    for seed in args.seeds:
        name = Path(args.config).stem + (f"_e{args.epochs}" if args.epochs else "")
        ckpt = train(args.config, args.work / "data", args.work / f"{name}_seed{seed}", seed, args.epochs)
        classifier = read_classifier(ckpt)
        f = {split: features(classifier, p) | {"mirror": features(classifier, p, mirror=True)}
             for split, p in paths.items()}
        correct = f["test"]["logits"].argmax(1) == labels["test"]
        calibrated[f"digits 0-4, seed {seed}"] = calibration(f, labels)
        print(f"seed {seed}: test top-1 {correct.mean():.3f}  ({ckpt})")
        if seed == args.seeds[0]:
            digits_test = (f["test"]["logits"], labels["test"])
        for score, s in scores(f, labels["train"]).items():
            results.setdefault(score, {})[seed] = measure(s, correct) | {"top1": float(correct.mean())}
    folder_test = {}
    for folder in args.calibration_folders:
        for seed in args.seeds:
            key = f"{folder}, seed {seed}"
            calibrated[key], folder_test[key] = folder_calibration(args, seed, folder)
    (args.work / "results.json").write_text(json.dumps({"unknown": results, "calibration": calibrated}, indent=1))
    table(results)
    print("\n| folder | T | test ECE before → after | NLL before → after | Brier before → after | top-1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, c in calibrated.items():
        b, a = c["before"], c["after"]
        print(f"| {name} | {c['T']:.2f} | {b['ece']:.4f} → {a['ece']:.4f} | {b['nll']:.3f} → {a['nll']:.3f} | "
              f"{b['brier']:.3f} → {a['brier']:.3f} | {a['top1']:.3f} |")
    if args.figure:  # vit's own reliability diagram (what `vit calibrate` draws on val), here on the test split
        from vit.deploy.calibration import reliability_bins
        from vit.reports import reliability_figure, save_figure

        first = args.seeds[0]
        shown = [("digits", digits_test, calibrated[f"digits 0-4, seed {first}"]["T"])]
        shown += [(folder, folder_test[f"{folder}, seed {first}"], calibrated[f"{folder}, seed {first}"]["T"])
                  for folder in args.calibration_folders]
        for name, (logits, y), t in shown:
            logits, y = torch.tensor(logits), torch.tensor(y)
            figure = reliability_figure(reliability_bins(logits, y), reliability_bins(logits, y, t), t,
                                        f"{name}, seed {first}: test split")
            print(f"wrote {save_figure(figure, args.figure.with_name(f'{args.figure.stem}_{name}.png'))}")
    return results


if __name__ == "__main__":
    main()
