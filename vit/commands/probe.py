"""`vit probe`: a frozen-feature baseline to run before fine-tuning.

    vit probe --config configs/digits.yaml
    vit probe --config configs/imagenet_vit_small.yaml --data vit.data.ImageFolder --data.root photos/ \\
        --model.init_args.pretrained vit_small_patch16_224.augreg_in21k_ft_in1k
    vit probe --config configs/finetune/folder_dinov2_small.yaml --data.init_args.root photos/ \\
        --model.init_args.model_kwargs "{global_pool: token_avg}"   # DINOv2's own linear evaluation

Any family works: the features are what its head reads (the cls token; the patch mean for DINOv3 and SigLIP gap;
SigLIP's attention pool; DeiT distilled's two tokens' mean). ``global_pool: token_avg`` gives DINOv2's
MODEL_CARD.md features instead: the cls token concatenated with the mean patch token (2 x width), and the
saved checkpoint is built with that pooling, so it predicts with what the probe was fit on.

The model and data come from the same config and flags as `vit fit` (the trainer's are ignored).
The evaluated weights' pooled, pre-logits features of the train, val and test splits are extracted
once, the training split through the evaluation transform (no augmentation), and cached on disk under a
hash of the weights and the data. On them: a logistic regression (standardised features, C chosen on
val) and a cosine kNN (k chosen on val), whose val and test top-1 are printed. C and k are chosen on val
only, so the test figure comes from images that chose nothing; where the data has no test split apart
from val (e.g. ``test_fraction: 0``), only val figures are reported, and they say so. The backbone with
the logistic regression folded into its head (scaler included) is saved as a `vit fit`-format checkpoint
that `vit predict --ckpt`, `vit attention --ckpt` and ``--model.init_args.pretrained`` accept, in a run
folder next to `vit fit`'s runs of the same config: ``<logger save_dir>/<name>/probe/version_N/``.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from vit.checkpoints.io import save_checkpoint
from vit.checkpoints.meta import classifier_checkpoint
from vit.checkpoints.runs import new_run_folder
from vit.features import blas_threads, cached_features, weights_key
from vit.files import cache_dir

C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
K_GRID = (1, 3, 5, 10, 20, 50)
SPLITS = ("train", "val", "test")
CHECKPOINT_NAME = "linear_probe.ckpt"


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The probe's own options, and the rest: `vit fit`'s model and data arguments."""
    parser = argparse.ArgumentParser(
        prog="vit probe", allow_abbrev=False,
        usage="vit probe --config CFG [--model.* ...] [--data.* ...] [--out CKPT] [--C C ...] [--k K ...] "
        "[--cache_dir DIR] [--no_cache] [--device DEV] [--batch_size N] [--num_workers N]",
        description="Linear-probe and kNN baseline on frozen ViT features, before fine-tuning. Prints the "
        "val and test top-1 of a logistic regression and a cosine kNN (C and k chosen on val; no test figure "
        "when the data has no test split apart from val), and saves the linear head as a checkpoint for "
        "`vit predict --ckpt` and `vit attention --ckpt`.",
        epilog="Model and data: any other argument is `vit fit`'s, e.g. --config configs/digits.yaml, "
        "--model.init_args.pretrained NAME_OR_FILE, --data vit.data.ImageFolder --data.root DIR "
        "(see `vit fit --help`). The trainer's settings are ignored: the probe trains nothing by gradient.",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="where to save the backbone with the logistic regression as its head (default: "
                        f"{CHECKPOINT_NAME} in a new run folder next to `vit fit`'s: the config's logger "
                        "save_dir/name/probe/version_N, e.g. logs/digits/probe/version_0)")
    parser.add_argument("--C", type=float, nargs="+", default=list(C_GRID), dest="C",
                        help="inverse L2 strengths to try; the best on val is kept (default: %(default)s)")
    parser.add_argument("--k", type=int, nargs="+", default=list(K_GRID),
                        help="neighbour counts to try; the best on val is kept, one value fixes it "
                        "(default: %(default)s)")
    parser.add_argument("--cache_dir", type=Path, default=cache_dir("features"),
                        help="where features are cached, keyed by weights and data (default: %(default)s)")
    parser.add_argument("--no_cache", action="store_true", help="extract features again and cache nothing")
    parser.add_argument("--device", default="auto",
                        help="auto (cuda when available), cpu, cuda:1, ... (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=256,
                        help="images per batch while extracting (default: %(default)s)")
    parser.add_argument("--num_workers", type=int, default=None,
                        help="DataLoader workers while extracting (default: the datamodule's)")
    args, rest = parser.parse_known_args(list(argv))
    if not rest:
        parser.error("no model or data given: pass a config (--config configs/digits.yaml) or --model/--data")
    if min(args.C) <= 0 or min(args.k) < 1 or args.batch_size < 1:
        parser.error(f"--C must be positive, --k and --batch_size at least 1; "
                     f"got {args.C}, {args.k}, {args.batch_size}")
    return args, rest


# ---- where the run goes, and which splits are held out -------------------------------------------------
def test_split_hint(data: Any) -> str:
    """How to give this datamodule a held-out test split."""
    if getattr(data, "split_folders", False):
        return f"add a test/ folder next to {data.root}/train and val"
    if hasattr(data, "test_fraction"):
        return "set --data.test_fraction (e.g. 0.1)"
    if hasattr(data, "val_size"):
        return "set --data.val_size (e.g. 5000) to hold val out of the training images"
    return "give the datamodule a test split apart from val"


def split_features(
    model: nn.Module, dataset: Dataset, split: str, weights: str, args: argparse.Namespace, device: torch.device,
    num_workers: int,
) -> tuple[Tensor, Tensor, str]:
    """A split's features, through the shared cache (`vit.features`), and where they came from."""
    return cached_features(model, {}, dataset, split, cache_dir=None if args.no_cache else args.cache_dir,
                           batch_size=args.batch_size, num_workers=num_workers, device=device, weights=weights)


# ---- the two probes -------------------------------------------------------------------------------------
def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Top-1: the fraction of labels predicted."""
    return float(np.mean(predicted == labels))


def fit_logistic(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], grid: Sequence[float]):
    """StandardScaler + multinomial logistic regression on train, C chosen by val top-1 (ties: smaller C).

    Returns (scaler, classifier, C, val top-1)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train[0])
    # A feature that barely varies (a random model's cls token: std 1e-5 where the others' is 1) would be
    # scaled up 1e5x, and so would its weight in the float32 head `folded_head` writes, whose logits then
    # lose their last digits to cancellation (W f and W mean, both ~1e5): the checkpoint disagreed with the
    # probe on near-ties, on one CPU and not another. Such a feature is scaled as if it varied 1e-3 as much as
    # the median feature: it still counts, with a weight the float32 head computes to 1e-4.
    scaler.scale_ = np.maximum(scaler.scale_, 1e-3 * np.median(scaler.scale_))
    x_train, x_val = scaler.transform(train[0]), scaler.transform(val[0])
    best = None
    clf = LogisticRegression(max_iter=2000, warm_start=True)  # along the path: each C starts from the last
    for c in sorted(set(grid)):
        clf.set_params(C=c).fit(x_train, train[1])
        score = accuracy(clf.predict(x_val), val[1])
        if best is None or score > best[2]:
            best = (copy.deepcopy(clf), c, score)
    return scaler, *best


def fit_knn(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], grid: Sequence[int]):
    """Cosine kNN with majority vote, k chosen by val top-1 (ties: larger k). Returns (classifier, k, val top-1)."""
    from sklearn.neighbors import KNeighborsClassifier

    best = None
    for k in sorted(set(grid), reverse=True):
        knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(*train)
        score = accuracy(knn.predict(val[0]), val[1])
        if best is None or score > best[2]:
            best = (knn, k, score)
    return best


def folded_head(scaler: Any, clf: Any, num_classes: int) -> tuple[Tensor, Tensor]:
    """(weight (num_classes, D), bias) of a Linear head whose softmax equals the scaler + logistic regression's
    predict_proba: logits = W (f - mean) / scale + b = (W / scale) f + (b - W mean / scale)."""
    coef, intercept = clf.coef_, clf.intercept_
    if coef.shape[0] == 1:  # binary: sigmoid(d) = softmax([-d/2, d/2])[1]
        coef, intercept = np.concatenate([-coef, coef]) / 2, np.concatenate([-intercept, intercept]) / 2
    weight = coef / scaler.scale_
    bias = intercept - weight @ scaler.mean_
    full_w = np.zeros((num_classes, weight.shape[1]))
    full_b = np.full(num_classes, -1e4)  # a class without training images is never predicted
    full_w[clf.classes_], full_b[clf.classes_] = weight, bias
    return torch.tensor(full_w, dtype=torch.float32), torch.tensor(full_b, dtype=torch.float32)


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit probe` with the given arguments (without the command name); returns the figures printed.

    ``*_test_acc`` are None, and ``held_out_test`` False, when the data has no test split apart from val."""
    from threadpoolctl import threadpool_limits

    from vit.data.base import no_test_reason

    args, rest = parse_args(argv)
    from vit.cli.main import build_model_and_data

    module, data, experiment = build_model_and_data(rest, "vit probe")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    model = module.eval_model.to(device).eval()
    data.prepare_data()
    data.setup("fit")
    num_workers = data.num_workers if args.num_workers is None else args.num_workers
    started, weights, found = time.perf_counter(), weights_key(model, module.model_config), {}
    no_test = no_test_reason(data)
    for split in SPLITS:
        if split == "test" and no_test:
            print(f"test: none held out ({no_test}), so no test figure: C and k are chosen on val, and the val "
                  f"figures, on the images that chose them, are optimistic. For a test figure, {test_split_hint(data)}")
            continue
        *found[split], how = split_features(model, data.eval_split(split), split, weights, args, device, num_workers)
        print(f"{split}: {len(found[split][1])} images, {found[split][0].shape[1]} features: {how}")
    print(f"features ready in {time.perf_counter() - started:.1f} s")
    as_numpy = lambda split: (found[split][0].numpy().astype(np.float64), found[split][1].numpy()) \
        if split in found else None
    train, val, test = map(as_numpy, SPLITS)  # test: None without a held-out test split

    with threadpool_limits(blas_threads(*train[0].shape), user_api="blas"):
        # Selection sees train and val only; the test split, if any, is scored once, by what val chose.
        scaler, clf, c, lr_val = fit_logistic(train, val, args.C)
        ks = {min(k, len(train[1])) for k in args.k}  # no more neighbours than training images
        knn, k, knn_val = fit_knn(train, val, ks)
        lr_test = None if test is None else accuracy(clf.predict(scaler.transform(test[0])), test[1])
        knn_test = None if test is None else accuracy(knn.predict(test[0]), test[1])
    chosen = lambda grid: f"chosen on val from {', '.join(map(str, sorted(set(grid))))}" if len(set(grid)) > 1 \
        else "fixed"
    scored = lambda val_acc, test_acc: f"val top-1 {val_acc:.4f}, " + (
        "no test figure (no held-out test split)" if test_acc is None else f"test top-1 {test_acc:.4f}")
    print(f"logistic regression (C={c:g}, {chosen(args.C)}): {scored(lr_val, lr_test)}")
    print(f"cosine kNN (k={k}, {chosen(ks)}): {scored(knn_val, knn_test)}")

    results = {"logistic_C": c, "logistic_val_acc": lr_val, "logistic_test_acc": lr_test,
               "knn_k": k, "knn_val_acc": knn_val, "knn_test_acc": knn_test, "held_out_test": test is not None}
    head = folded_head(scaler, clf, module.hparams.num_classes)
    path = args.out or new_run_folder(experiment / "probe") / CHECKPOINT_NAME
    weights = {**module.eval_model.state_dict(), "head.weight": head[0], "head.bias": head[1]}
    if "head_dist.weight" in weights:  # DeiT distilled: the heads' mean, on the tokens' mean the probe was fit on
        weights.update({"head_dist.weight": head[0], "head_dist.bias": head[1]})
    out = save_checkpoint(classifier_checkpoint(module.checkpoint_meta(), weights, probe=results), path)
    print(f"saved the backbone with the logistic-regression head to {out} (vit predict --ckpt {out} IMAGES)")
    return {**results, "checkpoint": str(out)}
