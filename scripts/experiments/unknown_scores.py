"""Candidate "unknown" scores on saved features, side by side (`unknown_digits.py` trains, saves and calls these).

Every score is fitted on the training split's features (and standardised on val where it sums layers) and
returns, for each split, one number an image (higher = more unknown). A split's features are a dict of arrays:
``logits`` (N, C), ``pooled`` (N, D: the head's input), ``block0..`` (N, D: each block's mean patch token), and
optionally ``views`` (a list of such dicts: shifted copies of the image, for TTA on the score). ``head`` holds the
classifier's weight (C, D) and bias (C,) for ViM and ReAct.

    max softmax       -max_c softmax(logits)_c                                     (Hendrycks & Gimpel 2017)
    energy            -logsumexp(logits)                                           (Liu et al. 2020)
    ReAct + energy    energy of the head on the pooled features clipped at their 90th train percentile (Sun 2021)
    ViM               alpha |z's residual off the train features' top-k principal space| - logsumexp(logits),
                      z measured from the origin -pinv(W) b, alpha = mean max logit / mean residual on train
    kNN               minus the cosine similarity to the k-th nearest training feature (Sun et al. 2022)
    Mahalanobis       min over classes of (z - mu_c)' P_c (z - mu_c) on L2-normalised features (Lee et al. 2018)
    relative Mahal.   the same minus the distance under one Gaussian of all training features (Ren et al. 2021)
    every layer       a score on each block's and the pooled features, each standardised on val, summed
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import logsumexp, softmax

Split = dict[str, np.ndarray]
Score = Callable[[Split], np.ndarray]


def l2(z: np.ndarray) -> np.ndarray:
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def layers_of(split: Split) -> list[str]:
    """The feature layers of a split, first block to pooled."""
    return [*sorted((k for k in split if k.startswith("block")), key=lambda k: int(k[5:])), "pooled"]


def gaussian(z: np.ndarray, labels: np.ndarray | None, shrink: float = 0.001, per_class: float = 0.1):
    """(means (C, D), precisions (C, D, D)) of L2-normalised features: the within-class covariance shrunk ``shrink``
    towards tr/D I, each class's own shrunk ``per_class`` towards it (0: shared), as `vit.deploy.calibration`.
    ``labels`` None: one Gaussian of all the features (relative Mahalanobis's background)."""
    labels = np.zeros(len(z), int) if labels is None else labels
    classes = np.unique(labels)
    means = np.stack([z[labels == c].mean(0) for c in classes])
    centred = z - means[np.searchsorted(classes, labels)]
    cov = centred.T @ centred / len(z)
    cov = (1 - shrink) * cov + shrink * np.trace(cov) / len(cov) * np.eye(len(cov))
    if per_class:
        own = [centred[labels == c].T @ centred[labels == c] / (labels == c).sum() for c in classes]
        return means, np.stack([np.linalg.inv((1 - per_class) * o + per_class * cov) for o in own])
    return means, np.stack([np.linalg.inv(cov)] * len(classes))


def distances(z: np.ndarray, means: np.ndarray, precisions: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of each row to each class (N, C)."""
    d = z[:, None, :] - means[None]
    return np.einsum("ncd,cde,nce->nc", d, precisions, d)


def mahalanobis(train: np.ndarray, labels: np.ndarray, relative: bool = False, **kw) -> Callable:
    """The class-conditional score of one layer (L2-normalised); ``relative``: minus the background's distance."""
    means, precisions = gaussian(l2(train), labels, **kw)
    background = gaussian(l2(train), None, kw.get("shrink", 0.001), 0.0) if relative else None

    def score(z: np.ndarray) -> np.ndarray:
        d = distances(l2(z), means, precisions)
        return (d - distances(l2(z), *background)).min(1) if relative else d.min(1)
    return score


def knn(train: np.ndarray, k: int = 10, bank: int | None = None, seed: int = 0) -> Callable:
    """Minus the cosine similarity to the k-th nearest of ``bank`` (a seeded subsample; None: all) train features."""
    z = l2(train)
    if bank is not None and bank < len(z):
        z = z[np.random.default_rng(seed).choice(len(z), bank, replace=False)]
    return lambda x: -np.sort(l2(x) @ z.T, axis=1)[:, -k]


def vim(train: Split, head: dict[str, np.ndarray], dim: int) -> Score:
    """ViM (Wang et al. 2022): the pooled features' norm off the train features' top-``dim`` principal space
    (measured from the head's origin -pinv(W) b), scaled to the logits, as a virtual logit against the energy."""
    w, b = head["weight"], head["bias"]
    origin = -np.linalg.pinv(w) @ b
    x = train["pooled"] - origin
    _, vectors = np.linalg.eigh(x.T @ x / len(x))  # ascending eigenvalues
    null = vectors[:, : x.shape[1] - dim]  # the residual space: all but the top-dim directions
    residual = lambda s: np.linalg.norm((s["pooled"] - origin) @ null, axis=1)
    alpha = train["logits"].max(1).mean() / residual(train).mean()
    return lambda s: alpha * residual(s) - logsumexp(s["logits"], 1)


def react_energy(train: Split, head: dict[str, np.ndarray], percentile: float = 90) -> Score:
    """ReAct (Sun et al. 2021): the energy of the head on the pooled features clipped at the train percentile."""
    clip = np.percentile(train["pooled"], percentile)
    return lambda s: -logsumexp(np.minimum(s["pooled"], clip) @ head["weight"].T + head["bias"], 1)


def every_layer(f: dict[str, Split], fit: Callable[[np.ndarray], Callable]) -> Score:
    """``fit`` (train features -> one layer's score) on every layer, each standardised on val, summed."""
    scores = {k: fit(f["train"][k]) for k in layers_of(f["train"])}
    loc = {k: (g(f["val"][k]).mean(), g(f["val"][k]).std()) for k, g in scores.items()}
    return lambda s: sum((g(s[k]) - loc[k][0]) / loc[k][1] for k, g in scores.items())


def class_consistent(f: dict[str, Split], labels: np.ndarray, **kw) -> Score:
    """Every layer's Mahalanobis distance to each class, standardised as `every_layer`'s (by its minimum's mean and
    standard deviation on val), summed over layers per class, then the minimum over classes: one class must explain
    every layer (a near unknown may sit near one class's last layer and another's first)."""
    fits = {k: gaussian(l2(f["train"][k]), labels, **kw) for k in layers_of(f["train"])}
    per_class = lambda s, k: distances(l2(s[k]), *fits[k])  # (N, C)
    loc = {k: (per_class(f["val"], k).min(1).mean(), per_class(f["val"], k).min(1).std()) for k in fits}
    return lambda s: sum((per_class(s, k) - loc[k][0]) / loc[k][1] for k in fits).min(1)


def standardised_sum(f: dict[str, Split], *parts: Score) -> Score:
    """The sum of scores, each standardised by its mean and standard deviation on val."""
    loc = [(p(f["val"]).mean(), p(f["val"]).std()) for p in parts]
    return lambda s: sum((p(s) - m) / sd for p, (m, sd) in zip(parts, loc))


def either(f: dict[str, Split], *parts: Score) -> Score:
    """The largest of the parts' val ranks (the share of val scoring below each): an image is unknown when any
    part finds it rarer than the threshold's share of val (one threshold for all, set on this score's val)."""
    ranks = [np.sort(p(f["val"])) for p in parts]
    return lambda s: np.max([np.searchsorted(r, p(s), side="left") / len(r) for r, p in zip(ranks, parts)], axis=0)


def tta(score: Score) -> Score:
    """The score averaged over the image and its ``views`` (shifted copies)."""
    return lambda s: np.mean([score(s), *(score(v) for v in s.get("views", []))], axis=0)


def candidates(f: dict[str, Split], labels: np.ndarray, head: dict[str, np.ndarray]) -> dict[str, Score]:
    """Each candidate, fitted on ``f["train"]`` (labels: its classes) and val."""
    train = f["train"]
    pooled = lambda g: lambda s: g(s["pooled"])
    per_class = lambda z: mahalanobis(z, labels)
    out: dict[str, Score] = {
        "max softmax": lambda s: -softmax(s["logits"], 1).max(1),
        "energy": lambda s: -logsumexp(s["logits"], 1),
        "ReAct + energy (p90)": react_energy(train, head),
        **{f"ViM, principal dim {d}": vim(train, head, d) for d in (8, 16, 32)},
        **{f"kNN pooled, k={k}, bank {b or 'all'}": pooled(knn(train["pooled"], k, b))
           for k, b in ((1, None), (10, None), (50, None), (10, 500))},
        "kNN every layer, k=10": every_layer(f, lambda z: knn(z, 10)),
        "Mahalanobis pooled, shared cov.": pooled(mahalanobis(train["pooled"], labels, per_class=0.0)),
        "Mahalanobis pooled, cov. per class": pooled(per_class(train["pooled"])),
        "relative Mahalanobis pooled, shared cov.": pooled(
            mahalanobis(train["pooled"], labels, relative=True, per_class=0.0)),
        "relative Mahalanobis pooled, cov. per class": pooled(
            mahalanobis(train["pooled"], labels, relative=True)),
        "every layer, shared cov.": every_layer(f, lambda z: mahalanobis(z, labels, per_class=0.0)),
        "every layer, cov. per class (vit's score until now)": every_layer(f, per_class),
        "every layer, relative, shared cov.": every_layer(
            f, lambda z: mahalanobis(z, labels, relative=True, per_class=0.0)),
        "every layer, relative, cov. per class": every_layer(f, lambda z: mahalanobis(z, labels, relative=True)),
    }
    out["every layer, cov. per class, one class for all layers"] = class_consistent(f, labels)
    out["every layer, shared cov., one class for all layers"] = class_consistent(f, labels, per_class=0.0)
    today = out["every layer, cov. per class (vit's score until now)"]
    out["every layer cov. per class + kNN every layer"] = standardised_sum(f, today, out["kNN every layer, k=10"])
    msp = out["max softmax"]
    out["max softmax + every layer cov. per class (standardised sum)"] = standardised_sum(f, msp, today)
    out["either max softmax or every layer cov. per class"] = either(f, msp, today)
    out["either max softmax or every layer, relative, shared cov."] = either(
        f, msp, out["every layer, relative, shared cov."])
    if "views" in f["val"]:
        out["every layer, cov. per class, TTA (4 shifts)"] = tta(today)
    return out


def measure(s: dict[str, np.ndarray], test_correct: np.ndarray, near: str = "near",
            far: tuple[str, ...] = ("tiles", "noise")) -> dict[str, float]:
    """AUROC and FPR at 95% TPR of test against the ``near`` unknowns; the threshold that accepts 95% of val, the
    share of each unknown set above it, and the accuracy on the accepted test images."""
    from sklearn.metrics import roc_auc_score

    inside = s["test"]

    def auroc(outside: np.ndarray) -> float:
        return float(roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(outside))], np.r_[inside, outside]))

    threshold = np.quantile(s["val"], 0.95, method="higher")
    accepted = inside <= threshold
    out = {"auroc": auroc(s[near]), "fpr95": float((s[near] <= np.quantile(inside, 0.95)).mean()),
           "rejected": float((s[near] > threshold).mean()), "test_accepted": float(accepted.mean()),
           "acc_accepted": float(test_correct[accepted].mean())}
    return out | {f"rejected_{k}": float((s[k] > threshold).mean()) for k in far if k in s}
