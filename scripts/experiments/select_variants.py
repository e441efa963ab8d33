"""Cold-start variants for `vit select` (issue 67), judged without the test images: the linear probe of
`select_labels.py` scored on its validation slice (1,000 pool images outside both arms' choices, their simulation
labels), optionally a fine-tuning recipe on the same slice, and the choice's stability: how many chosen images
change when the features are scaled by 1 + a relative noise of 1e-4 (labels unused).

    kmeans     `typical_diverse` as it was before TypiClust's outlier rule (k-means, 3 restarts, every cluster)
    k{R}m{M}   `typical_diverse(restarts=R, min_cluster=M)`: k3m5 is the default now
    ward, average   a hierarchical clustering (scikit-learn, L2-normalised features) cut at budget clusters, then
               TypiClust's pick (the most typical image of each cluster, outlier clusters of 5 or fewer last)
    probcover  ProbCover (Yehuda et al. 2022): the largest ball radius whose balls are 95% pure under k-means
               pseudo-labels (as many as the classes: 10), then greedy max coverage

Seeds are the k-means start and the random draw; 3 and up are the ones the test tables never report.

    python scripts/experiments/select_variants.py --cache CACHE --variants kmeans k3m5 k10m5 ward --seeds 3 4 5
    python scripts/experiments/select_variants.py --cache CACHE --variants kmeans ward --seeds 3 4 5 \\
        --datasets mnist5k --budgets 5 --fit lpft_x10 --nudges 0
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import select_labels as s  # a sibling: on sys.path when run
import torch

from vit.active.choose import normalised, typical_diverse, typicality


def hierarchical(features: np.ndarray, budget: int, linkage: str, min_cluster: int = 5) -> list[int]:
    from sklearn.cluster import AgglomerativeClustering

    x, chosen = normalised(features), []
    assign = AgglomerativeClustering(n_clusters=budget, linkage=linkage).fit_predict(x)
    sizes = np.bincount(assign)
    taken = np.zeros(len(x), bool)
    for group in ([c for c in range(len(sizes)) if sizes[c] > min_cluster],  # outlier clusters last
                  [c for c in range(len(sizes)) if sizes[c] <= min_cluster]):
        group.sort(key=lambda c: (-sizes[c], c))
        while taken.sum() < budget and any((~taken[assign == c]).any() for c in group):  # in turn, largest first
            for c in group:
                members = np.flatnonzero((assign == c) & ~taken)
                if len(members) and taken.sum() < budget:
                    chosen.append(int(members[np.argmax(typicality(x[members]))]))
                    taken[chosen[-1]] = True
    return chosen


def probcover(features: np.ndarray, budget: int, seed: int, classes: int = 10, purity: float = 0.95) -> list[int]:
    from sklearn.cluster import KMeans

    x = normalised(features)
    d = np.sqrt(np.maximum(2 - 2 * x @ x.T, 0))
    pseudo = KMeans(n_clusters=classes, n_init=10, random_state=seed).fit_predict(x)
    other = pseudo[:, None] != pseudo[None, :]
    radius = 0.0
    for r in np.quantile(d[np.triu_indices(len(x), 1)], np.linspace(0.001, 0.2, 60)):
        if (~((d <= r) & other).any(1)).mean() >= purity:
            radius = r
    ball = d <= radius
    covered, chosen = np.zeros(len(x), bool), []
    for _ in range(budget):
        gain = (ball & ~covered[None, :]).sum(1)
        gain[chosen] = -1
        chosen.append(int(np.argmax(gain)))
        covered |= ball[chosen[-1]]
    return chosen


def chooser(variant: str):
    if variant == "kmeans":
        return lambda x, b, seed: [p.index for p in typical_diverse(x, b, seed=seed, restarts=3, min_cluster=0)]
    if variant in ("ward", "average"):
        return lambda x, b, seed: hierarchical(x, b, variant)
    if variant == "probcover":
        return probcover
    restarts, min_cluster = (int(v) for v in variant[1:].split("m"))
    return lambda x, b, seed: [p.index for p in typical_diverse(x, b, seed=seed, restarts=restarts,
                                                                min_cluster=min_cluster)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, required=True, help="select_labels.py's cache (its two MAEs)")
    parser.add_argument("--variants", nargs="+", default=["kmeans", "k3m5"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    parser.add_argument("--budgets", type=int, nargs="+", default=list(s.BUDGETS), help="labels a class")
    parser.add_argument("--nudges", type=int, default=1, help="1e-4 nudges a choice is repeated on")
    parser.add_argument("--fit", default=None, choices=sorted(s.RECIPES), help="also this recipe on the slice")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("vit.checkpoints.weights").setLevel(logging.ERROR)
    from sklearn.preprocessing import StandardScaler

    loaders = {"digits": s.digits_data, "mnist5k": s.mnist_data}
    for name in args.datasets:
        pool, y, _, _ = loaders[name]()  # the test images are not read
        mae = args.cache / f"mae_{name}.ckpt"
        x = s.encode(mae, pool)
        scaler = StandardScaler().fit(x)
        xs = scaler.transform(x)
        for variant in args.variants:
            choose = chooser(variant)
            for per_class in args.budgets:
                budget, start = per_class * s.CLASSES, time.perf_counter()
                row: dict = {"select": [], "random": [], "fit_select": [], "fit_random": [], "changed": []}
                for seed in args.seeds:
                    arms = {"select": choose(x, budget, seed),
                            "random": np.random.default_rng(seed).choice(len(y), budget, replace=False)}
                    held = s.validation(y, np.concatenate([np.asarray(i) for i in arms.values()]))
                    for arm, idx in arms.items():
                        row[arm].append(s.probe(xs[idx], y[idx], xs[held], y[held]))
                        if args.fit:
                            stem = f"variants-val-{args.fit}_{name}_{per_class}_{arm}-{variant}_{seed}"
                            path = args.cache / f"{stem}.json"
                            row[f"fit_{arm}"].append(s.fine_tune(
                                s.RECIPES[args.fit], mae, pool, y, idx, (pool[held], torch.as_tensor(y[held])), path,
                                scaler, seed))
                    for n in range(args.nudges):
                        nudged = x * (1 + 1e-4 * np.random.default_rng(100 + n).standard_normal(x.shape))
                        row["changed"].append(len(set(arms["select"]) - set(choose(nudged, budget, seed))))
                line = f"{name} {per_class}/class {variant}: val probe select {np.mean(row['select']):.3f} " \
                       f"{np.round(row['select'], 3).tolist()}, random {np.mean(row['random']):.3f}"
                if args.fit:
                    line += f"; val {args.fit} select {np.mean(row['fit_select']):.3f} " \
                            f"{np.round(row['fit_select'], 3).tolist()}, random {np.mean(row['fit_random']):.3f} " \
                            f"{np.round(row['fit_random'], 3).tolist()}"
                print(f"{line}; nudged: changed {row['changed']} of {budget} ({time.perf_counter() - start:.0f} s)",
                      flush=True)


if __name__ == "__main__":
    main()
