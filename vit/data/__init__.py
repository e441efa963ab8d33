"""LightningDataModules: images for classification (text for translation lives beside them)."""

from vit.data.images import CIFAR, Digits, ImageDataModule, ImageFolder, ImageNet

__all__ = ["CIFAR", "Digits", "ImageDataModule", "ImageFolder", "ImageNet"]
