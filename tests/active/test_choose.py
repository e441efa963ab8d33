"""`vit.active.choose`: TypiClust's typical point of each planted cluster, duplicates and labelled clusters skipped,
outlier clusters last (TypiClust's round robin), and a later round's uncertain batch spread over its confusions;
expected values from plain numpy and scikit-learn's metrics."""

from __future__ import annotations

import numpy as np
import pytest

from vit.active.choose import margins, typical_diverse, typicality, uncertain_diverse


def planted(sizes=(40, 30, 20, 12), seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Well-separated clusters on the unit sphere's neighbourhood (directions far apart), and their members."""
    rng = np.random.default_rng(seed)
    centres = np.eye(8)[: len(sizes)] * 10
    x = np.concatenate([c + rng.normal(scale=0.6, size=(n, 8)) for c, n in zip(centres, sizes)])
    return x, np.repeat(np.arange(len(sizes)), sizes)


def numpy_typical(x: np.ndarray, members: np.ndarray, k: int = 20, allowed: np.ndarray | None = None) -> int:
    """The member of highest 1 / mean distance to its k nearest other members, by brute force on unit rows."""
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    sub = u[members]
    d = np.sqrt(((sub[:, None, :] - sub[None, :, :]) ** 2).sum(-1))
    kk = min(k, len(members) - 1)
    score = 1 / np.sort(d, axis=1)[:, 1:kk + 1].mean(1)
    if allowed is not None:
        score[~allowed[members]] = -np.inf
    return int(members[np.argmax(score)])


def test_typicality_equals_the_inverse_mean_distance_to_the_k_nearest():
    x = np.random.default_rng(1).normal(size=(25, 3))
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    expected = 1 / np.sort(d, axis=1)[:, 1:6].mean(1)
    np.testing.assert_allclose(typicality(x, 5), expected, rtol=1e-10)


def test_the_cold_start_picks_the_most_typical_image_of_every_planted_cluster():
    x, cluster = planted()
    picks = typical_diverse(x, 4, seed=0)
    expected = {numpy_typical(x, np.flatnonzero(cluster == c)) for c in range(4)}
    assert {p.index for p in picks} == expected
    assert [cluster[p.index] for p in picks] == [0, 1, 2, 3]  # the largest cluster first
    assert all(p.reason.startswith("typical") for p in picks)


def test_an_excluded_duplicate_is_never_picked_its_clusters_next_most_typical_is():
    x, cluster = planted()
    first = typical_diverse(x, 4, seed=0)
    excluded = np.zeros(len(x), bool)
    excluded[first[1].index] = True  # the typical image of cluster 1 is a near-duplicate of one kept elsewhere
    picks = typical_diverse(x, 4, excluded=excluded, seed=0)
    assert first[1].index not in {p.index for p in picks}
    assert picks[1].index == numpy_typical(x, np.flatnonzero(cluster == 1), allowed=~excluded)
    assert cluster[picks[1].index] == 1


def test_a_cluster_with_a_label_already_gets_no_more():
    x, cluster = planted()
    labelled = np.zeros(len(x), bool)
    labelled[np.flatnonzero(cluster == 0)[:1]] = True
    picks = typical_diverse(x, 3, labelled=labelled, seed=0)
    assert sorted(cluster[p.index] for p in picks) == [1, 2, 3]


@pytest.mark.parametrize("budget", [5, 6])
def test_more_picks_than_clusters_fill_from_the_densest_and_never_exceed_the_free_images(budget):
    x = np.random.default_rng(2).normal(size=(6, 4))
    excluded = np.zeros(6, bool)
    excluded[0] = True
    picks = typical_diverse(x, budget, excluded=excluded)
    assert len(picks) == 5 and 0 not in {p.index for p in picks}  # 5 free images: a budget of 6 gets 5
    assert len({p.index for p in picks}) == 5


def test_margins_are_the_top_probability_less_the_second():
    p = np.array([[0.7, 0.2, 0.1], [0.4, 0.45, 0.15], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(margins(p), [0.5, 0.05, 0.0], atol=1e-12)


def test_a_later_round_spreads_its_uncertain_picks_over_separate_confusions():
    x, cluster = planted(sizes=(8, 40))  # the 20 candidates: cluster 0's 8 and cluster 1's 12 least sure
    rng = np.random.default_rng(3)
    top = np.where(cluster == 0, rng.uniform(0.5, 0.52, len(x)), rng.uniform(0.53, 0.56, len(x)))  # 0: least sure
    p = np.stack([top, 1 - top], 1)
    labelled = np.zeros(len(x), bool)
    picks = uncertain_diverse(x, p, 2, labelled=labelled, class_names=["cat", "dog"])
    assert sorted(cluster[q.index] for q in picks) == [0, 1]  # not the two least sure, both of cluster 0
    m = np.abs(2 * top - 1)
    for q in picks:  # each the least sure of its cluster
        in_cluster = np.flatnonzero(cluster == cluster[q.index])
        assert q.index == in_cluster[np.argmin(m[in_cluster])]
        assert "margin" in q.reason and "cat" in q.reason and "dog" in q.reason
    plain = np.argsort(m)[:2]
    assert set(cluster[plain]) == {0}  # what margin alone would ask for


def test_a_later_round_never_picks_a_labelled_or_excluded_image():
    x, _ = planted(sizes=(10, 10))
    p = np.full((20, 2), 0.5)
    labelled, excluded = np.zeros(20, bool), np.zeros(20, bool)
    labelled[:8], excluded[8:12] = True, True
    picks = uncertain_diverse(x, p, 20, labelled=labelled, excluded=excluded)
    assert sorted(q.index for q in picks) == list(range(12, 20))


def with_outliers() -> tuple[np.ndarray, np.ndarray]:
    """Three planted clusters (40, 30, 20) and three lone images far from them and from each other (cluster -1)."""
    x, cluster = planted(sizes=(40, 30, 20))
    outliers = np.eye(8)[5:8] * 10
    return np.concatenate([x, outliers]), np.concatenate([cluster, [-1, -1, -1]])


def test_kmeans_labels_recover_the_planted_clusters_and_isolate_the_outliers():
    from sklearn.metrics import adjusted_rand_score

    from vit.active.choose import kmeans_labels, normalised

    x, cluster = with_outliers()
    truth = np.where(cluster >= 0, cluster, 3 + np.arange(len(x)) - (len(x) - 3))  # each outlier its own cluster
    assert adjusted_rand_score(truth, kmeans_labels(normalised(x), 6, seed=0)) == 1.0


def test_outlier_clusters_give_no_image_while_a_large_cluster_has_one_typiclust_round_robin():
    x, cluster = with_outliers()
    picks = typical_diverse(x, 6, seed=0)  # 6 clusters: 3 planted, 3 single outliers (5 images or fewer)
    assert [cluster[p.index] for p in picks] == [0, 1, 2, 0, 1, 2]  # fewest chosen first, then the largest
    for c in range(3):
        members = np.flatnonzero(cluster == c)
        first, second = [p.index for p in picks if cluster[p.index] == c]
        assert first == numpy_typical(x, members)
        assert second == numpy_typical(x, members[members != first])  # its density without the first pick
    assert "already" in picks[3].reason and "unlabelled cluster" in picks[0].reason
    old_rule = typical_diverse(x, 6, seed=0, min_cluster=0)  # every cluster its one pick: the outliers too
    assert sorted(cluster[p.index] for p in old_rule) == [-1, -1, -1, 0, 1, 2]



@pytest.mark.parametrize("small, expected", [(5, [0, 1, 0]), (6, [0, 1, 2])])
def test_a_cluster_of_min_cluster_images_is_an_outlier_one_more_is_not(small, expected):
    x, cluster = planted(sizes=(40, 7, small))  # TypiClust drops clusters of 5 or fewer, keeps 6
    assert [cluster[p.index] for p in typical_diverse(x, 3, seed=0)] == expected


def test_an_outlier_cluster_gives_its_images_once_the_larger_have_none_free():
    x, cluster = planted(sizes=(40, 5))
    excluded = cluster == 0
    picks = typical_diverse(x, 2, excluded=excluded, seed=0)  # clusters: the 40, the 5
    assert [cluster[p.index] for p in picks] == [1, 1]
    assert picks[0].index == numpy_typical(x, np.flatnonzero(cluster == 1))


def test_a_label_and_a_pick_count_alike_in_the_round_robin():
    # clusters of 30, 20, 12, 10, the last two excluded whole, one label in the 20: by TypiClust's rule the 30 gives
    # the first pick (none yet), then ties the 20 at one each and, larger, gives the second; the 20 the third
    x, cluster = planted(sizes=(30, 20, 12, 10))
    labelled = np.zeros(len(x), bool)
    labelled[np.flatnonzero(cluster == 1)[0]] = True
    picks = typical_diverse(x, 3, labelled=labelled, excluded=cluster >= 2, seed=0)
    assert [cluster[p.index] for p in picks] == [0, 0, 1]
