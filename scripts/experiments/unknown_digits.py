"""Held-out classes as "unknown": train on the digits 0-4, score the digits 5-9, for every candidate score.

    flock /tmp/vit-heavy.lock python scripts/experiments/unknown_digits.py --work /tmp/unknown --seeds 0 1 2

scikit-learn's digits 0-4 are written as 32x32 PNGs, split 60/20/20 (stratified, split seed 0) and `vit fit`
trains ``--config`` (configs/scratch_small.yaml, hflip off) on them, once per training seed. The best checkpoint's
pooled features (the ones `vit probe` reads) of train/val/test 0-4 and of all 5-9 go through each score below;
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


def train(config: str, root: Path, run: Path, seed: int, epochs: int | None) -> Path:
    """`vit fit` on root/train,val,test; the best checkpoint."""
    args = [sys.executable, "-m", "vit", "fit", "--config", str(ROOT / config), "--data.init_args.root", str(root),
            "--data.init_args.hflip", "0", "--data.init_args.num_workers", "0", "--seed_everything", str(seed),
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
def features(classifier, paths: list[Path]) -> dict[str, np.ndarray]:
    """Logits, the pooled pre-logits features and every block's mean patch token, for ``paths``."""
    transform = classifier.eval_transform()
    model = classifier.model
    x = torch.stack([transform(Image.open(p).convert(classifier.image_mode)) for p in paths])
    blocks: list[torch.Tensor] = []
    tokens = model.tokens(x, on_block=lambda i, t: blocks.append(t[:, model.num_prefix_tokens:].mean(1)))
    pooled = model.forward_head(tokens, pre_logits=True)
    out = {"logits": model.head(pooled), "pooled": pooled}
    out.update({f"block{i}": b for i, b in enumerate(blocks)})
    return {k: v.double().numpy() for k, v in out.items()}


def l2(z: np.ndarray) -> np.ndarray:
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def mahalanobis(train: np.ndarray, labels: np.ndarray, relative: bool = False, shrink: float = 0.0):
    """The class-conditional score with one shared covariance (Lee et al. 2018): min over classes of the squared
    distance; ``relative``: minus the distance to one Gaussian of all training features (Ren et al. 2021);
    ``shrink``: the covariance shrunk towards tr/D times the identity (what `vit.calibration.fit_unknown` does)."""
    means = np.stack([train[labels == c].mean(0) for c in KNOWN])
    centred = train - means[labels]
    cov = centred.T @ centred / len(train)
    cov = (1 - shrink) * cov + shrink * np.trace(cov) / len(cov) * np.eye(len(cov))
    precision = np.linalg.pinv(cov)
    mu0 = train.mean(0)
    precision0 = np.linalg.pinv(np.cov(train - mu0, rowvar=False, bias=True))

    def score(z: np.ndarray) -> np.ndarray:
        d = z[:, None, :] - means[None]
        dist = np.einsum("ncd,de,nce->nc", d, precision, d)
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
        "Mahalanobis, L2, shrunk 1% (vit's)": (lambda g: lambda s: g(l2(s["pooled"])))(
            mahalanobis(l2(f["train"]["pooled"]), labels, shrink=0.01)),
        "relative Mahalanobis": (lambda g: lambda s: g(s["pooled"]))(
            mahalanobis(f["train"]["pooled"], labels, relative=True)),
    }
    # several layers: each block's L2-normalised Mahalanobis, standardised on val, summed (Lee et al. 2018's ensemble)
    per_layer = {k: mahalanobis(l2(f["train"][k]), labels) for k in [*layers, "pooled"]}
    stats = {k: (g(l2(f["val"][k])).mean(), g(l2(f["val"][k])).std()) for k, g in per_layer.items()}
    fitted["Mahalanobis, L2, all layers"] = lambda s: sum(
        (g(l2(s[k])) - stats[k][0]) / stats[k][1] for k, g in per_layer.items())
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
    return {"auroc": float(auroc), "fpr95": fpr95, "rejected": float((outside > threshold).mean()),
            "test_accepted": float(accepted.mean()), "acc_accepted": float(test_correct[accepted].mean())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/unknown_digits"))
    parser.add_argument("--config", default="configs/scratch_small.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's max_epochs")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    from vit.deploy.classifier import read_classifier

    paths, _ = write_folder(args.work / "data")
    labels = {k: np.array([int(p.parent.name) for p in v]) for k, v in paths.items() if k != "unknown"}
    results: dict[str, dict] = {}
    for seed in args.seeds:
        name = Path(args.config).stem + (f"_e{args.epochs}" if args.epochs else "")
        ckpt = train(args.config, args.work / "data", args.work / f"{name}_seed{seed}", seed, args.epochs)
        classifier = read_classifier(ckpt)
        f = {split: features(classifier, p) for split, p in paths.items()}
        correct = f["test"]["logits"].argmax(1) == labels["test"]
        print(f"seed {seed}: test top-1 {correct.mean():.3f}  ({ckpt})")
        for score, s in scores(f, labels["train"]).items():
            results.setdefault(score, {})[seed] = measure(s, correct) | {"top1": float(correct.mean())}
    (args.work / "results.json").write_text(json.dumps(results, indent=1))
    print("\n| score | AUROC (mean ± sd) | FPR@95%TPR | unknown rejected @95% val | acc on accepted |")
    print("|---|---:|---:|---:|---:|")
    for score, per_seed in results.items():
        col = {m: np.array([r[m] for r in per_seed.values()]) for m in ("auroc", "fpr95", "rejected", "acc_accepted")}
        print(f"| {score} | {col['auroc'].mean():.3f} ± {col['auroc'].std():.3f} | {col['fpr95'].mean():.2f} | "
              f"{100 * col['rejected'].mean():.0f}% ± {100 * col['rejected'].std():.0f} | "
              f"{col['acc_accepted'].mean():.3f} |")
    return results


if __name__ == "__main__":
    main()
