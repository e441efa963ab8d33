"""Label issues by confident learning (Northcutt, Jiang & Chuang, "Confident Learning: Estimating Uncertainty
in Dataset Labels", JAIR 2021), written from the paper.

1. Out-of-fold probabilities: a k-fold logistic regression on backbone features, so no image is scored by a
   model that saw its label.
2. Per-class thresholds: t_j is the mean probability of class j over the images labelled j (the class's
   average self-confidence).
3. The confident joint: an image labelled i counts towards class j when its probability of j reaches t_j
   (the largest such probability wins when several do). The images counted off the diagonal (j != i) are
   the flagged label issues, and j is the label suggested for them (the paper's C_{ỹ,y*} method).
4. Ranking: every image by self-confidence, its out-of-fold probability of its given label, lowest first.

How well this works depends on the features: a backbone that separates the classes finds wrong labels, one
that does not flags ambiguous images instead. So `trust` scores the out-of-fold classifier itself: its accuracy
and balanced accuracy beside chance, and its skill, (balanced accuracy - 1/K) / (1 - 1/K): 0 at chance, 1
when perfect. Below ``MIN_SKILL`` the list is not presented as wrong labels (the rule's measurement, from
untrained to trained features, is in docs/audit.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SKILL = 0.7  # below it a list is too close to chance to trust: untrained digit features flag mostly correct
# labels there (the figures: docs/audit.md)


def trust(probabilities: np.ndarray, labels: np.ndarray, min_skill: float = MIN_SKILL) -> dict:
    """How far to trust a list from these out-of-fold ``probabilities``: accuracy and balanced accuracy beside
    chance (the largest class's share; 1/K for K classes present), the skill, and the verdict."""
    labels = np.asarray(labels)
    predicted = probabilities.argmax(axis=1)
    present = np.unique(labels)
    accuracy = float(np.mean(predicted == labels))
    balanced = float(np.mean([np.mean(predicted[labels == c] == c) for c in present]))
    chance_balanced = 1 / len(present)
    skill = (balanced - chance_balanced) / (1 - chance_balanced) if len(present) > 1 else 0.0
    trusted = skill >= min_skill
    verdict = (f"out-of-fold accuracy {accuracy:.3f} (chance {np.bincount(labels).max() / len(labels):.3f}), "
               f"balanced {balanced:.3f} (chance {chance_balanced:.3f})")
    if not trusted:
        verdict += (f": the classifier behind the list is too close to chance (skill {skill:.2f} < {min_skill}) for "
                    "its images to be wrong labels rather than hard ones; no image is called wrongly labelled. "
                    "Pass features that separate the classes (--model.init_args.pretrained)")
    return {"accuracy": round(accuracy, 4), "balanced_accuracy": round(balanced, 4),
            "chance_accuracy": round(float(np.bincount(labels).max() / len(labels)), 4),
            "chance_balanced_accuracy": round(chance_balanced, 4), "skill": round(float(skill), 4),
            "min_skill": min_skill, "trusted": bool(trusted), "verdict": verdict}


@dataclass
class LabelIssues:
    """Confident learning's verdict on n images of K classes."""

    probabilities: np.ndarray  # (n, K) out-of-fold
    thresholds: np.ndarray  # (K,) per-class average self-confidence
    self_confidence: np.ndarray  # (n,) probability of the given label
    suggested: np.ndarray  # (n,) the confident class where flagged, else the most probable one
    flagged: np.ndarray  # (n,) bool: off the confident joint's diagonal
    ranking: np.ndarray  # (n,) image indices, most suspicious (lowest self-confidence) first

    def ranked_flagged(self) -> np.ndarray:
        """Indices of the flagged images, most suspicious first."""
        return self.ranking[self.flagged[self.ranking]]


def out_of_fold_probabilities(
    features: np.ndarray, labels: np.ndarray, num_classes: int, *, folds: int = 5, C: float = 1.0, seed: int = 0,
) -> np.ndarray:
    """(n, num_classes) probabilities, each row from a standardised logistic regression fitted on the other
    folds (stratified). Classes a fold's model never saw get probability 0."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    labels = np.asarray(labels)
    counts = np.bincount(labels)
    splits = max(2, min(folds, int(counts[counts > 0].min())))  # every class in every fold where it can be
    probabilities = np.zeros((len(labels), num_classes))
    for train, held_out in StratifiedKFold(splits, shuffle=True, random_state=seed).split(features, labels):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))
        model.fit(features[train], labels[train])
        probabilities[np.ix_(held_out, model.classes_)] = model.predict_proba(features[held_out])
    return probabilities


def confident_learning(probabilities: np.ndarray, labels: np.ndarray) -> LabelIssues:
    """Thresholds, confident joint, flags, suggestions and ranking (see the module docstring)."""
    labels = np.asarray(labels)
    n, k = probabilities.shape
    self_confidence = probabilities[np.arange(n), labels]
    thresholds = np.full(k, np.inf)  # a class without images is never confidently any image's
    for j in np.unique(labels):
        thresholds[j] = self_confidence[labels == j].mean()
    above = probabilities >= thresholds  # (n, K)
    confident = np.where(above, probabilities, -np.inf).argmax(axis=1)
    counted = above.any(axis=1)  # images above no threshold are not in the confident joint
    flagged = counted & (confident != labels)
    suggested = np.where(flagged, confident, probabilities.argmax(axis=1))
    ranking = np.argsort(self_confidence, kind="stable")
    return LabelIssues(probabilities, thresholds, self_confidence, suggested, flagged, ranking)
