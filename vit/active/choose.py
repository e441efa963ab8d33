"""Which unlabelled images to label next, from their features alone (numpy and scikit-learn; no torch).

    picks = typical_diverse(features, budget, labelled=mask, excluded=dups)        # a cold start, or no model yet
    picks = uncertain_diverse(features, probabilities, budget, labelled=mask)      # later rounds: a trained model

Cold start, TypiClust (Hacohen et al., 2022): k-means the L2-normalised features into as many clusters as there
will be labels (those already given plus ``budget``); each pick comes from the cluster with the fewest labelled or
chosen images, the largest first, and is its most *typical* image: the densest, the inverse mean distance to its
``k`` nearest neighbours in its cluster (labelled and chosen images left out). Clusters of ``MIN_CLUSTER`` images
or fewer are outliers and give an image only when no larger cluster has one left, as in TypiClust's code. At a few
labels a class, an outlier or a second image of a well-covered mode teaches the model less than the centre of a
mode nobody labelled; uncertainty sampling loses to random there (the model knows nothing).

Later rounds: the margin between the top two calibrated probabilities says which images the model is unsure of,
but the ``budget`` least sure are often copies of one confusion. So the ``CANDIDATES`` x budget least sure are
clustered into ``budget`` clusters and each gives its least sure image (cluster-margin sampling, Citovsky et al.
2021, in its simplest form).

``excluded`` images (near-duplicates of an image kept, `vit.active.pool.duplicate_followers`) still count in the
clustering and density (they are data) but are never chosen. A pick is ``(index, reason)``: the reason in words,
for the labels file.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

TYPICAL_NEIGHBOURS = 20  # TypiClust's k
RESTARTS = 3  # k-means++ starts, the lowest inertia kept (10 and 30 were tried: docs/few-labels.md)
MIN_CLUSTER = 5  # TypiClust's: clusters this small or smaller (outliers) are chosen from last
CANDIDATES = 10  # later rounds: cluster the CANDIDATES x budget least sure images


class Pick(NamedTuple):
    index: int
    reason: str


def normalised(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float64): k-means on them clusters by cosine, as self-supervised features
    are compared."""
    x = np.asarray(features, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def typicality(x: np.ndarray, k: int = TYPICAL_NEIGHBOURS) -> np.ndarray:
    """1 / (mean Euclidean distance to the ``k`` nearest other rows) of each row of ``x`` (N, D); a single row: 1."""
    n = len(x)
    if n == 1:
        return np.ones(1)
    from sklearn.neighbors import NearestNeighbors

    k = min(k, n - 1)
    distances, _ = NearestNeighbors(n_neighbors=k + 1).fit(x).kneighbors(x)  # in chunks: no N x N matrix
    return 1.0 / np.maximum(distances[:, 1:].mean(1), 1e-12)  # column 0: the row itself (or an equal row)


def kmeans_labels(x: np.ndarray, clusters: int, seed: int, restarts: int = RESTARTS) -> np.ndarray:
    """The k-means cluster of each row: of ``restarts`` k-means++ starts (scikit-learn's ``n_init``), the one of
    lowest inertia."""
    from sklearn.cluster import KMeans

    clusters = min(clusters, len(np.unique(x, axis=0)))
    return KMeans(n_clusters=clusters, n_init=restarts, random_state=seed).fit_predict(x)


def _masks(n: int, labelled: np.ndarray | None, excluded: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    labelled = np.zeros(n, bool) if labelled is None else np.asarray(labelled, bool)
    excluded = np.zeros(n, bool) if excluded is None else np.asarray(excluded, bool)
    return labelled, excluded


def typical_diverse(features: np.ndarray, budget: int, *, labelled: np.ndarray | None = None,
                    excluded: np.ndarray | None = None, k: int = TYPICAL_NEIGHBOURS, seed: int = 0,
                    restarts: int = RESTARTS, min_cluster: int = MIN_CLUSTER) -> list[Pick]:
    """``budget`` images by TypiClust's rule: each pick from the cluster with the fewest labelled or chosen images,
    the largest first, its most typical image not yet labelled or chosen. Clusters of ``min_cluster`` images or
    fewer (outliers) give images only when no larger cluster has one left."""
    x = normalised(features)
    labelled, excluded = _masks(len(x), labelled, excluded)
    free = ~labelled & ~excluded
    budget = min(budget, int(free.sum()))
    if budget == 0:
        return []
    assign = kmeans_labels(x, int(labelled.sum()) + budget, seed, restarts)
    sizes = np.bincount(assign)
    counts = np.bincount(assign[labelled], minlength=len(sizes))  # labels in each cluster, then picks too
    large = [c for c in range(len(sizes)) if sizes[c] > min_cluster]
    small = [c for c in range(len(sizes)) if sizes[c] <= min_cluster]
    given = labelled.copy()  # labelled or chosen: out of the cluster's density, as TypiClust drops them
    picks: list[Pick] = []
    for candidates in (large, small):
        while len(picks) < budget:
            open_clusters = [c for c in candidates if (free & ~given)[assign == c].any()]
            if not open_clusters:
                break
            c = min(open_clusters, key=lambda c: (counts[c], -sizes[c], c))
            members = np.flatnonzero((assign == c) & ~given)
            score = typicality(x[members], k)
            score[~free[members]] = -np.inf
            i = int(members[int(np.argmax(score))])
            reason = (f"typical: the densest image of an unlabelled cluster of {sizes[c]}" if counts[c] == 0 else
                      f"typical: the densest image left of a cluster of {sizes[c]} with {counts[c]} already")
            picks.append(Pick(i, reason))
            given[i], counts[c] = True, counts[c] + 1
    return picks


def margins(probabilities: np.ndarray) -> np.ndarray:
    """The top probability less the second of each row (N, C): 0 is a tie, 1 certainty."""
    top2 = -np.partition(-np.asarray(probabilities, dtype=np.float64), 1, axis=1)[:, :2]
    return top2[:, 0] - top2[:, 1]


def uncertain_diverse(features: np.ndarray, probabilities: np.ndarray, budget: int, *,
                      labelled: np.ndarray | None = None, excluded: np.ndarray | None = None,
                      class_names: list[str] | None = None, seed: int = 0) -> list[Pick]:
    """``budget`` images the model is unsure of (small margin of the calibrated ``probabilities``), one per
    cluster of the ``CANDIDATES`` x budget least sure, so the batch spans several confusions."""
    x = normalised(features)
    labelled, excluded = _masks(len(x), labelled, excluded)
    free = np.flatnonzero(~labelled & ~excluded)
    budget = min(budget, len(free))
    if budget == 0:
        return []
    margin = margins(probabilities)
    candidates = free[np.argsort(margin[free], kind="stable")[:CANDIDATES * budget]]
    assign = kmeans_labels(x[candidates], budget, seed)
    chosen = [int(candidates[assign == c][0]) for c in np.unique(assign)]  # candidates are sorted: [0] least sure
    rest = [int(i) for i in candidates if int(i) not in set(chosen)]
    chosen += rest[:budget - len(chosen)]  # fewer clusters than asked (identical features)
    names = class_names or [str(c) for c in range(np.shape(probabilities)[1])]
    picks = []
    for i in chosen:
        a, b = np.argsort(-np.asarray(probabilities[i]), kind="stable")[:2]
        picks.append(Pick(i, f"uncertain: margin {margin[i]:.3f} between {names[a]} and {names[b]}"))
    return picks
