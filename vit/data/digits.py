"""scikit-learn's bundled 8x8 handwritten digits: the offline default dataset."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from vit.data.base import ImageDataModule
from vit.data.fingerprint import fingerprint
from vit.data.io import stratified_split
from vit.errors import UserValueError

# Mean and std of the digits' pixels scaled to 0..1 (all 1,797 images).
DIGITS_MEAN = (0.3053,)
DIGITS_STD = (0.3760,)


def digit_images(img_size: int = 8) -> tuple[Tensor, Tensor]:
    """All 1,797 digits as (N, 1, S, S) pixels scaled to 0..1 (S = ``img_size``, upsampled bilinearly from 8),
    and their labels (N,): what `Digits` trains on, before normalising, for using a digits checkpoint outside it."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    if img_size != 8:
        # Upsampled once (bilinear): each patch of a larger grid then sees its neighbours' pixels.
        images = F.interpolate(images, size=(img_size, img_size), mode="bilinear", align_corners=False)
    return images, torch.tensor(digits.target, dtype=torch.int64)


class DigitsSet(Dataset):
    """Digits as normalised (1, S, S) tensors (S = img_size), with an optional training transform
    (on the 0..1 image, before normalising).

    ``indices`` are the images' positions in scikit-learn's ``load_digits()``, which name them."""

    def __init__(self, images: Tensor, labels: Tensor, mean: Sequence[float], std: Sequence[float],
                 transform: Callable | None = None, indices: Sequence[int] | None = None) -> None:
        self.images, self.labels, self.transform = images, labels, transform
        self.indices = list(range(len(labels))) if indices is None else [int(i) for i in indices]
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x = self.images[index]
        if self.transform is not None:
            x = self.transform(x)
        return (x - self.mean) / self.std, self.labels[index]

    def fingerprint(self) -> str:
        """A hash of the images, labels, normalisation and transform."""
        return fingerprint(type(self).__name__, repr(self.transform), self.images, self.labels, self.mean, self.std)

    def item_name(self, index: int) -> str:
        """``digits[i]``: the image's position in scikit-learn's ``load_digits()``."""
        return f"digits[{self.indices[index]}]"

    def raw_image(self, index: int) -> Image.Image:
        """Item ``index`` as an 8-bit grayscale image at the split's size (0..1 scaled to 0..255)."""
        pixels = (self.images[index, 0] * 255).round().clamp(0, 255).to(torch.uint8)  # (S, S)
        return Image.fromarray(pixels.numpy(), mode="L")


class Digits(ImageDataModule):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes, no download).

    The split is fixed by ``seed`` (default 0) and stratified by class (rounded per class):
    20% test (359 images), 10% validation (179), the remaining 70% (1,259) for training. Pixels 0..16
    are scaled to 0..1 and normalised with the dataset's mean/std; ``img_size`` > 8 upsamples them
    (bilinear). Training images get a small random affine (shift, rotation, zoom; all 0 / [1, 1] = off);
    timm's augmentation (``auto_augment``, ``re_prob``, ...) does not apply to 8x8 digits and is off.

    Args:
        val_fraction: share of each class held out for validation.
        test_fraction: share of each class held out for test.
        max_shift: largest shift in whole pixels at ``img_size``.
        max_rotation: largest rotation in degrees.
        zoom: range of the zoom factor.
    """

    in_chans = 1

    def __init__(
        self,
        *,
        batch_size: int = 64,
        num_workers: int = 0,
        img_size: int = 8,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        max_shift: float = 1.0,
        max_rotation: float = 10.0,
        zoom: tuple[float, float] = (0.9, 1.1),
        seed: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_workers=num_workers, img_size=img_size, mean=DIGITS_MEAN,
            std=DIGITS_STD, crop_pct=1.0, interpolation="bilinear", seed=seed,
            auto_augment=None, re_prob=0.0, hflip=0.0, color_jitter=0.0, scale=(1.0, 1.0),
        )
        if img_size < 8:
            raise UserValueError(f"Digits img_size must be at least the native 8, got {img_size}")
        if not 0 < val_fraction < 1 or not 0 < test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise UserValueError(
                f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be in (0, 1) "
                "and leave images for training"
            )
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.max_shift, self.max_rotation, self.zoom = float(max_shift), float(max_rotation), tuple(zoom)
        self.class_names = [str(i) for i in range(10)]

    def train_transform(self) -> Callable | None:
        """The worker-side training transform: a random affine of the 0..1 image, or None when it is off."""
        if self.max_shift == 0 and self.max_rotation == 0 and self.zoom == (1.0, 1.0):
            return None
        from torchvision.transforms import v2

        shift = self.max_shift / self.img_size  # RandomAffine takes the shift as a fraction
        return v2.RandomAffine(degrees=self.max_rotation, translate=(shift, shift), scale=self.zoom,
                               interpolation=v2.InterpolationMode.BILINEAR)

    def without_augmentation(self, dataset: DigitsSet) -> DigitsSet:
        """The same digits without the random affine."""
        return DigitsSet(dataset.images, dataset.labels, self.mean, self.std, indices=dataset.indices)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = digit_images(self.img_size)
        train_idx, val_idx, test_idx = stratified_split(
            labels.numpy(), [self.val_fraction, self.test_fraction], self.seed
        )
        make = lambda idx, tf: DigitsSet(images[idx], labels[idx], self.mean, self.std, tf, idx.tolist())
        self.train_set = make(train_idx, self.train_transform())
        self.val_set = make(val_idx, None)
        self.test_set = make(test_idx, None)
        rank_zero_info(f"digits: {len(train_idx)} train, {len(val_idx)} val, {len(test_idx)} test images, "
                       f"{self.num_classes} classes")
