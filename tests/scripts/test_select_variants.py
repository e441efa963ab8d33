"""scripts/experiments/select_variants.py: its hierarchical and ProbCover choosers on planted clusters (the truth
is the planting), and its "kmeans" arm is the rule before the outlier clusters went last."""

import numpy as np
import pytest

from tests import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("select_variants")


def planted(sizes=(40, 30, 20), outliers=3, seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.eye(8)[c] * 10 + rng.normal(scale=0.6, size=(n, 8)) for c, n in enumerate(sizes)])
    x = np.concatenate([x, np.eye(8)[8 - outliers:] * 10])
    return x, np.concatenate([np.repeat(np.arange(len(sizes)), sizes), -np.ones(outliers, int)])


@pytest.mark.parametrize("linkage", ["ward", "average"])
def test_hierarchical_takes_the_large_clusters_in_turn_and_the_outliers_last(script, linkage):
    x, cluster = planted()
    assert [cluster[i] for i in script.hierarchical(x, 6, linkage)] == [0, 1, 2, 0, 1, 2]


def test_the_kmeans_arm_is_the_old_rule_one_pick_a_cluster_outliers_too(script):
    x, cluster = planted()
    assert sorted(cluster[i] for i in script.chooser("kmeans")(x, 6, 0)) == [-1, -1, -1, 0, 1, 2]
    assert sorted(cluster[i] for i in script.chooser("k3m5")(x, 6, 0)) == [0, 0, 1, 1, 2, 2]


def test_probcover_covers_each_planted_cluster_once(script):
    x, cluster = planted(outliers=0)
    assert sorted(cluster[i] for i in script.probcover(x, 3, seed=0, classes=3)) == [0, 1, 2]
