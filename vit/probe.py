"""The frozen-feature baselines of `vit probe`: a logistic regression and a cosine kNN on pooled features.

    x, y, how = split_features(model, dataset, "train", weights=weights_key(model, config), cache_dir=...)
    probes = fit_probes(train, val, test, c_grid=C_GRID, k_grid=K_GRID)   # C and k chosen on val
    state_dict = probe_state_dict(model.state_dict(), folded_head(probes.scaler, probes.logistic, num_classes))

The features come from `vit.features` (extracted once, cached on disk). C and k are chosen on val only, and the
test split, when there is one apart from val, is scored once by what val chose. The logistic regression, with its
feature scaling, folds into a plain ``Linear`` head, so the probe is saved as a checkpoint every command reads.
scikit-learn is imported when a probe is fit; nothing here imports Lightning.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from vit.features import blas_threads, cached_features

C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
K_GRID = (1, 3, 5, 10, 20, 50)

Split = tuple[np.ndarray, np.ndarray]  # features (N, D) float64, labels (N,)


def split_features(
    model: nn.Module, dataset: Dataset, split: str, *, weights: str, cache_dir: Path | None, batch_size: int = 256,
    num_workers: int = 0, device: torch.device | str = "cpu",
) -> tuple[np.ndarray, np.ndarray, str]:
    """A split's features (float64) and labels, through the shared cache (`vit.features`), and where they came
    from; ``weights`` is `vit.features.weights_key`'s hash of the model, computed once for every split."""
    features, labels, how = cached_features(model, {}, dataset, split, cache_dir=cache_dir, batch_size=batch_size,
                                            num_workers=num_workers, device=device, weights=weights)
    return features.numpy().astype(np.float64), labels.numpy(), how


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Top-1: the fraction of labels predicted."""
    return float(np.mean(predicted == labels))


def fit_logistic(train: Split, val: Split, grid: Sequence[float]) -> tuple[Any, Any, float, float]:
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


def fit_knn(train: Split, val: Split, grid: Sequence[int]) -> tuple[Any, int, float]:
    """Cosine kNN with majority vote, k chosen by val top-1 (ties: larger k). Returns (classifier, k, val top-1)."""
    from sklearn.neighbors import KNeighborsClassifier

    best = None
    for k in sorted(set(grid), reverse=True):
        knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(*train)
        score = accuracy(knn.predict(val[0]), val[1])
        if best is None or score > best[2]:
            best = (knn, k, score)
    return best


@dataclass
class Probes:
    """Both probes, fit on train with C and k chosen on val; the test figures are None without a test split."""

    scaler: Any  # sklearn StandardScaler
    logistic: Any  # sklearn LogisticRegression, on scaled features
    C: float
    logistic_val_acc: float
    logistic_test_acc: float | None
    knn: Any  # sklearn KNeighborsClassifier
    k: int
    ks: set[int]  # the neighbour counts tried: the grid, each at most the training images
    knn_val_acc: float
    knn_test_acc: float | None

    def results(self) -> dict[str, Any]:
        """The figures, as `vit probe` returns them and its checkpoint records them."""
        return {"logistic_C": self.C, "logistic_val_acc": self.logistic_val_acc,
                "logistic_test_acc": self.logistic_test_acc, "knn_k": self.k, "knn_val_acc": self.knn_val_acc,
                "knn_test_acc": self.knn_test_acc, "held_out_test": self.logistic_test_acc is not None}


def fit_probes(train: Split, val: Split, test: Split | None, *, c_grid: Sequence[float] = C_GRID,
               k_grid: Sequence[int] = K_GRID) -> Probes:
    """Both probes on train, C and k chosen on val alone; ``test`` (None: no held-out test split) scored once."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(blas_threads(*train[0].shape), user_api="blas"):
        scaler, clf, c, lr_val = fit_logistic(train, val, c_grid)
        ks = {min(k, len(train[1])) for k in k_grid}  # no more neighbours than training images
        knn, k, knn_val = fit_knn(train, val, ks)
        lr_test = None if test is None else accuracy(clf.predict(scaler.transform(test[0])), test[1])
        knn_test = None if test is None else accuracy(knn.predict(test[0]), test[1])
    return Probes(scaler, clf, c, lr_val, lr_test, knn, k, ks, knn_val, knn_test)


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


def probe_state_dict(state_dict: dict[str, Tensor], head: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    """The model's weights with ``head`` (`folded_head`'s) as its head; a DeiT-distilled model gets it as both
    heads, whose mean, on the tokens' mean the probe was fit on, is then the probe's."""
    weights = {**state_dict, "head.weight": head[0], "head.bias": head[1]}
    if "head_dist.weight" in weights:
        weights.update({"head_dist.weight": head[0], "head_dist.bias": head[1]})
    return weights
