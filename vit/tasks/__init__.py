"""LightningModules: what to train (classification; translation lives beside it)."""

from vit.tasks.classify import ImageClassifier, load_classifier

__all__ = ["ImageClassifier", "load_classifier"]
