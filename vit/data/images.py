"""Image classification DataModules: bundled digits, CIFAR-10/100, ImageNet and your own folders.

Every DataModule knows ``num_classes``, ``class_names``, ``img_size``, ``in_chans``, ``mean``, ``std``
and ``crop_pct`` right after ``__init__``, so the CLI can link them into the model (and from there
into the checkpoint). Batches are ``(images (B, C, H, W) float, labels (B,) int64)``.
"""

from __future__ import annotations

import logging
import os
import pickle
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import CIFAR10 as CIFAR10Dataset
from torchvision.datasets import CIFAR100 as CIFAR100Dataset

log = logging.getLogger(__name__)

IMAGENET_MEAN = IMAGENET_DEFAULT_MEAN
IMAGENET_STD = IMAGENET_DEFAULT_STD
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
# Mean and std of the digits' pixels scaled to 0..1 (all 1,797 images).
DIGITS_MEAN = (0.3053,)
DIGITS_STD = (0.3760,)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup",
    "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house",
    "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
    "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew",
    "skunk", "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower",
    "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor", "train", "trout",
    "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)


def stratified_split(
    labels: Sequence[int], fractions: Sequence[float], seed: int
) -> list[np.ndarray]:
    """Split indices so each part keeps the class proportions; returns [rest, part1, part2, ...].

    Within each class the indices are shuffled with ``seed`` and each part takes
    ``round(fraction * class_count)`` of them (at least one when the class has two or more).
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        start = 0
        for i, fraction in enumerate(fractions):
            n = round(fraction * len(idx))
            if fraction > 0 and len(idx) >= 2:
                n = max(1, n)
            parts[i + 1].extend(idx[start:start + n].tolist())
            start += n
        parts[0].extend(idx[start:].tolist())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def to_rgb(img: Image.Image) -> Image.Image:
    """Any common PIL mode (1, L, LA, P, RGBA, CMYK, I;16, I, F) -> 8-bit RGB.

    16-bit and 32-bit modes are rescaled to 0..255 first; PIL's own conversion would clip them.
    """
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        if img.mode == "F" and arr.max(initial=0) <= 1.0:
            top = 1.0
        arr = np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(arr).convert("RGB")  # 2-D uint8 -> "L"
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # as PIL recommends for palette images with transparency
    return img.convert("RGB")


def load_image(path: str | os.PathLike, mode: str = "RGB") -> Image.Image:
    """Open and fully decode an image as RGB (or "L"), or raise an error that names the file."""
    try:
        with Image.open(path) as img:
            img.load()
            rgb = to_rgb(img)
    except Exception as e:  # PIL raises several types for bad files; all mean the same to a user
        raise OSError(f"cannot read image {path}: {type(e).__name__}: {e}") from e
    return rgb.convert("L") if mode == "L" else rgb


def is_image_file(path: str | os.PathLike) -> bool:
    """Whether the file name has an image extension."""
    return str(path).lower().endswith(IMAGE_EXTENSIONS)


class ImageFiles(Dataset):
    """(path, label) samples decoded to RGB and transformed; a bad file's error names it."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable | None = None) -> None:
        self.samples = list(samples)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        img = load_image(path)
        return (self.transform(img) if self.transform else img), label


class TransformedSubset(Dataset):
    """A subset of a dataset of (PIL image, label), with its own transform."""

    def __init__(self, dataset: Dataset, indices: Sequence[int], transform: Callable | None) -> None:
        self.dataset = dataset
        self.indices = list(indices)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img, label = self.dataset[self.indices[index]]
        return (self.transform(img) if self.transform else img), int(label)


def class_folders(root: Path) -> list[str]:
    """Sorted names of the sub-folders of ``root`` (one per class), or a clear error."""
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise ValueError(
            f"{root} has no class sub-folders; expected {root}/<class name>/<image files>"
        )
    return classes


def scan_class_folders(
    root: Path, classes: Sequence[str], skip_bad_images: bool = False
) -> list[tuple[str, int]]:
    """List (path, label) of the images under ``root/<class>/`` (recursively).

    Files without an image extension are skipped with one warning that counts them. With
    ``skip_bad_images`` every image is decoded once here and unreadable ones are skipped and
    counted; otherwise a bad image raises when it is loaded, naming the file.
    """
    samples: list[tuple[str, int]] = []
    not_images: Counter[str] = Counter()
    bad: list[str] = []
    for label, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            raise ValueError(f"class {name!r} has no folder {folder}")
        found = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            if path.name.startswith("."):
                continue
            if not is_image_file(path):
                not_images[path.suffix.lower() or path.name] += 1
                continue
            if skip_bad_images:
                try:
                    load_image(path)
                except OSError:
                    bad.append(str(path))
                    continue
            samples.append((str(path), label))
            found += 1
        if found == 0:
            raise ValueError(f"class folder {folder} has no images (expected files like *.jpg, *.png)")
    if not_images:
        kinds = ", ".join(f"{n} {k}" for k, n in not_images.most_common())
        warnings.warn(
            f"skipped {sum(not_images.values())} files under {root} that are not images ({kinds})",
            stacklevel=2,
        )
    if bad:
        shown = ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
        warnings.warn(f"skipped {len(bad)} unreadable images under {root}: {shown}", stacklevel=2)
    return samples


def _posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's posterize op, also for 0 bits kept: an all-black image, as Pillow < 13 returned."""
    if bits_to_keep < 1:
        return img.point(lambda _: 0)
    from timm.data.auto_augment import posterize

    return posterize(img, bits_to_keep, **kwargs)


def guard_posterize(transform: Callable) -> Callable:
    """Let timm's AutoAugment/RandAugment/AugMix posterize keep 0 bits, in place; returns ``transform``.

    timm (1.0.31) maps the top magnitude of "PosterizeIncreasing" (and the bottom of "Posterize") to
    0 bits kept, meaning a black image. Pillow 13.0 made ``ImageOps.posterize`` refuse bits < 1, so
    about 0.1-0.4% of RandAugment draws raised ValueError and killed training in its first epoch.
    Swapping the op in our own transforms keeps timm's augmentation exactly as it was with
    Pillow <= 12, without pinning Pillow or patching timm for other users in the process.
    """
    from timm.data import auto_augment

    for t in getattr(transform, "transforms", [transform]):
        ops = list(getattr(t, "ops", []))  # RandAugment, AugMixAugment
        ops += [op for sub_policy in getattr(t, "policy", []) for op in sub_policy]  # AutoAugment
        for op in ops:
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = _posterize
    return transform


def make_eval_transform(
    in_chans: int, size: tuple[int, int], crop_pct: float, interpolation: str,
    mean: Sequence[float], std: Sequence[float],
) -> Callable:
    """timm's evaluation transform: resize to ``size / crop_pct``, centre crop ``size``, normalise.

    Shared by the DataModules and by prediction from a checkpoint, so both see the same inputs.
    """
    from timm.data import create_transform

    return create_transform(
        input_size=(in_chans, *size), is_training=False, crop_pct=crop_pct,
        interpolation=interpolation, mean=mean, std=std,
    )


class ImageDataModule(LightningDataModule):
    """Shared options and loaders; subclasses build ``train_set``, ``val_set``, ``test_set``.

    Training transforms come from timm's ``create_transform`` (random resized crop, hflip, colour
    jitter, RandAugment/AutoAugment, random erasing); evaluation is resize + centre crop
    (``crop_pct``, bicubic) and normalisation with ``mean``/``std``.

    Args:
        batch_size: images per batch (per device).
        num_workers: DataLoader worker processes.
        img_size: side of the square images the model sees.
        mean, std: normalisation per channel.
        auto_augment: timm policy string, e.g. "rand-m9-mstd0.5-inc1" or "autoaug"; None = off.
        re_prob: random-erasing probability.
        hflip: horizontal flip probability.
        color_jitter: colour-jitter strength (0 = off).
        scale: range of the random resized crop's area fraction.
        crop_pct: evaluation centre-crop fraction (resize to img_size / crop_pct, then crop).
        interpolation: resize interpolation.
        seed: seed of any split this DataModule carves.
    """

    in_chans = 3

    def __init__(
        self,
        batch_size: int = 128,
        num_workers: int = 4,
        img_size: int = 224,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        auto_augment: str | None = None,
        re_prob: float = 0.0,
        hflip: float = 0.5,
        color_jitter: float = 0.0,
        scale: tuple[float, float] = (0.08, 1.0),
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if len(mean) != self.in_chans or len(std) != self.in_chans:
            raise ValueError(f"mean and std need {self.in_chans} values, got {list(mean)} and {list(std)}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.img_size = img_size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.auto_augment = auto_augment
        self.re_prob = re_prob
        self.hflip = hflip
        self.color_jitter = color_jitter
        self.scale = tuple(scale)
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        self.seed = seed
        self.class_names: list[str] = []
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.class_names)

    def train_transform(self) -> Callable:
        """timm's training transform built from this DataModule's options."""
        from timm.data import create_transform

        return guard_posterize(create_transform(
            input_size=(self.in_chans, self.img_size, self.img_size), is_training=True,
            scale=self.scale, hflip=self.hflip, color_jitter=self.color_jitter or None,
            auto_augment=self.auto_augment, re_prob=self.re_prob, re_mode="pixel",
            interpolation=self.interpolation, mean=self.mean, std=self.std,
        ))

    def eval_transform(self) -> Callable:
        """timm's evaluation transform: resize, centre crop (crop_pct), normalise."""
        return make_eval_transform(
            self.in_chans, (self.img_size, self.img_size), self.crop_pct, self.interpolation,
            self.mean, self.std,
        )

    def _loader(self, dataset: Dataset | None, name: str, train: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {name} split; was setup() called?")
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=train, num_workers=self.num_workers,
            drop_last=train and len(dataset) > self.batch_size, pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, "train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")


class _DigitsSet(Dataset):
    """Digits as (1, S, S) tensors in 0..1 (S = img_size), with optional small random shifts/rotations."""

    def __init__(self, images: Tensor, labels: Tensor, mean: Sequence[float], std: Sequence[float],
                 augment: Callable | None = None) -> None:
        self.images, self.labels, self.augment = images, labels, augment
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x = self.images[index]
        if self.augment is not None:
            x = self.augment(x)
        return (x - self.mean) / self.std, self.labels[index]


class Digits(ImageDataModule):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes, no download).

    The split is fixed by ``split_seed`` (default 0) and stratified by class (rounded per class):
    20% test (359 images), 10% validation (179), the remaining 70% (1,259) for training. Pixels 0..16
    are scaled to 0..1 and normalised with the dataset's mean/std; ``img_size`` > 8 upsamples them
    (bilinear). Training augmentation is a small random affine (``max_shift`` whole pixels at
    ``img_size``, ``max_rotation`` degrees, ``scale_range``).
    """

    in_chans = 1

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int = 0,
        img_size: int = 8,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        augment: bool = True,
        max_shift: float = 1.0,
        max_rotation: float = 10.0,
        scale_range: tuple[float, float] = (0.9, 1.1),
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_workers=num_workers, img_size=img_size, mean=DIGITS_MEAN,
            std=DIGITS_STD, hflip=0.0, crop_pct=1.0, interpolation="bilinear", seed=split_seed,
        )
        if img_size < 8:
            raise ValueError(f"Digits img_size must be at least the native 8, got {img_size}")
        if not 0 < val_fraction < 1 or not 0 < test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise ValueError(
                f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be in (0, 1) "
                "and leave images for training"
            )
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.augment, self.max_shift, self.max_rotation = augment, max_shift, max_rotation
        self.scale_range = tuple(scale_range)
        self.class_names = [str(i) for i in range(10)]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
        if self.img_size != 8:
            # Upsampled once (bilinear): each patch of a larger grid then sees its neighbours' pixels.
            images = F.interpolate(images, size=(self.img_size, self.img_size), mode="bilinear",
                                   align_corners=False)  # (N, 1, S, S)
        labels = torch.tensor(digits.target, dtype=torch.int64)
        train_idx, val_idx, test_idx = stratified_split(
            digits.target, [self.val_fraction, self.test_fraction], self.split_seed
        )
        augment = None
        if self.augment:
            from torchvision.transforms import v2

            shift = self.max_shift / self.img_size  # RandomAffine takes the shift as a fraction of the side
            augment = v2.RandomAffine(
                degrees=self.max_rotation, translate=(shift, shift), scale=self.scale_range,
                interpolation=v2.InterpolationMode.BILINEAR,
            )
        make = lambda idx, aug: _DigitsSet(images[idx], labels[idx], self.mean, self.std, aug)
        self.train_set = make(train_idx, augment)
        self.val_set = make(val_idx, None)
        self.test_set = make(test_idx, None)


class _PresentCIFAR10(CIFAR10Dataset):
    """torchvision's CIFAR-10, accepting files that are present without their md5 check (a re-packed
    or partial copy); a damaged file still fails when it is unpickled."""

    def _check_integrity(self) -> bool:
        folder = Path(self.root) / self.base_folder
        return all((folder / name).is_file() for name, _ in self.train_list + self.test_list)

    def _load_meta(self) -> None:
        path = Path(self.root) / self.base_folder / self.meta["filename"]
        if not path.is_file():
            raise RuntimeError(f"metadata file {path} not found")
        with open(path, "rb") as f:
            self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


class _PresentCIFAR100(CIFAR100Dataset):
    """torchvision's CIFAR-100, with the same presence-only check as `_PresentCIFAR10`."""

    _check_integrity = _PresentCIFAR10._check_integrity
    _load_meta = _PresentCIFAR10._load_meta


class CIFAR(ImageDataModule):
    """CIFAR-10 or CIFAR-100 in torchvision's on-disk format (``root/cifar-10-batches-py`` or
    ``root/cifar-100-python``). Downloads when ``download`` is true; the validation split is
    ``val_size`` training images chosen (stratified) with ``seed``; test is the official test set.

    Args:
        root: folder that holds (or will hold) the extracted dataset.
        variant: 10 or 100.
        download: fetch the dataset when it is missing (needs internet).
        val_size: training images held out for validation (0 = validate on the test set).
    """

    def __init__(
        self,
        root: str = "data",
        variant: int = 10,
        download: bool = False,
        val_size: int = 5000,
        batch_size: int = 128,
        num_workers: int = 4,
        img_size: int = 32,
        mean: Sequence[float] = CIFAR_MEAN,
        std: Sequence[float] = CIFAR_STD,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        hflip: float = 0.5,
        color_jitter: float = 0.0,
        scale: tuple[float, float] = (0.6, 1.0),
        crop_pct: float = 1.0,
        interpolation: str = "bicubic",
        seed: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_workers=num_workers, img_size=img_size, mean=mean, std=std,
            auto_augment=auto_augment, re_prob=re_prob, hflip=hflip, color_jitter=color_jitter,
            scale=scale, crop_pct=crop_pct, interpolation=interpolation, seed=seed,
        )
        if variant not in (10, 100):
            raise ValueError(f"CIFAR variant must be 10 or 100, got {variant}")
        self.root, self.variant, self.download, self.val_size = Path(root), variant, download, val_size
        self.class_names = list(CIFAR10_CLASSES if variant == 10 else CIFAR100_CLASSES)

    @property
    def folder(self) -> Path:
        """Where torchvision keeps the extracted files."""
        return self.root / ("cifar-10-batches-py" if self.variant == 10 else "cifar-100-python")

    @property
    def expected_files(self) -> list[str]:
        """The files torchvision reads from ``folder``."""
        if self.variant == 10:
            return [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
        return ["train", "test", "meta"]

    def _dataset(self, train: bool, download: bool) -> Dataset:
        cls = _PresentCIFAR10 if self.variant == 10 else _PresentCIFAR100
        try:
            return cls(str(self.root), train=train, download=download)
        except (RuntimeError, OSError) as e:  # torchvision: "Dataset not found"; URLError when offline
            missing = [f for f in self.expected_files if not (self.folder / f).is_file()]
            hint = (
                "the download failed (are you offline?); " if download else "set `download: true` or "
            )
            raise FileNotFoundError(
                f"CIFAR-{self.variant} not found in {self.folder} (missing: {', '.join(missing) or 'none'}; "
                f"expected {', '.join(self.expected_files)}). {hint}"
                f"put the extracted python version of CIFAR-{self.variant} there. ({type(e).__name__}: {e})"
            ) from e
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as e:
            raise ValueError(
                f"{self.folder}: a CIFAR-{self.variant} file is damaged or not in the python pickle format "
                f"({type(e).__name__}: {e}); delete the folder and download it again"
            ) from e

    def prepare_data(self) -> None:
        if self.download:
            self._dataset(train=True, download=True)
            self._dataset(train=False, download=True)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_full = self._dataset(train=True, download=False)
        test = self._dataset(train=False, download=False)
        if list(train_full.classes) != self.class_names:
            raise ValueError(
                f"{self.folder}: class names in the meta file {list(train_full.classes)[:5]}... differ "
                f"from CIFAR-{self.variant}'s {self.class_names[:5]}..."
            )
        if self.val_size > 0:
            if self.val_size >= len(train_full):
                raise ValueError(f"val_size {self.val_size} leaves no training images of {len(train_full)}")
            train_idx, val_idx = stratified_split(
                train_full.targets, [self.val_size / len(train_full)], self.seed
            )
            self.val_set = TransformedSubset(train_full, val_idx, self.eval_transform())
        else:
            train_idx = np.arange(len(train_full))
            self.val_set = TransformedSubset(test, range(len(test)), self.eval_transform())
        self.train_set = TransformedSubset(train_full, train_idx, self.train_transform())
        self.test_set = TransformedSubset(test, range(len(test)), self.eval_transform())


class ImageFolder(ImageDataModule):
    """Your own images: ``root/<class>/<image>`` split by ``val_fraction`` (stratified, seeded),
    or ``root/train/<class>/...`` and ``root/val/<class>/...`` (and optionally ``root/test/``).

    Images of any common mode (grayscale, palette, RGBA, CMYK, 16-bit) become RGB. Files that are
    not images are skipped with one warning. A corrupt image raises an error naming it when it is
    loaded, or, with ``skip_bad_images``, is found by decoding every image once at setup and skipped.
    Without a ``test/`` folder, testing uses ``test_fraction`` of a single folder, or else val.

    Args:
        root: the dataset folder.
        val_fraction: share of each class held out for validation (single-folder layout only).
        test_fraction: share of each class held out for test (single-folder layout only).
        skip_bad_images: skip unreadable images instead of failing on them.
    """

    def __init__(
        self,
        root: str,
        val_fraction: float = 0.2,
        test_fraction: float = 0.0,
        skip_bad_images: bool = False,
        batch_size: int = 64,
        num_workers: int = 4,
        img_size: int = 224,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        hflip: float = 0.5,
        color_jitter: float = 0.4,
        scale: tuple[float, float] = (0.08, 1.0),
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        seed: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_workers=num_workers, img_size=img_size, mean=mean, std=std,
            auto_augment=auto_augment, re_prob=re_prob, hflip=hflip, color_jitter=color_jitter,
            scale=scale, crop_pct=crop_pct, interpolation=interpolation, seed=seed,
        )
        self.root = Path(root)
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.skip_bad_images = skip_bad_images
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder not found: {self.root}")
        self.split_folders = (self.root / "train").is_dir()
        if self.split_folders:
            self.class_names = class_folders(self.root / "train")
            if not (self.root / "val").is_dir():
                raise FileNotFoundError(
                    f"{self.root} has train/ but no val/ folder; expected {self.root}/val/<class>/<images>"
                )
            for split in ("val", "test"):
                if (self.root / split).is_dir():
                    extra = sorted(set(class_folders(self.root / split)) - set(self.class_names))
                    if extra:
                        raise ValueError(
                            f"{self.root / split} has classes that {self.root / 'train'} lacks: {extra}"
                        )
        else:
            if not 0 < val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
                raise ValueError(
                    f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be in [0, 1) "
                    "and leave images for training"
                )
            self.class_names = class_folders(self.root)

    def _scan(self, folder: Path) -> list[tuple[str, int]]:
        present = class_folders(folder)
        # val/test may lack some classes; labels always follow train's class list.
        samples = scan_class_folders(folder, present, self.skip_bad_images)
        remap = [self.class_names.index(name) for name in present]
        return [(path, remap[label]) for path, label in samples]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_tf, eval_tf = self.train_transform(), self.eval_transform()
        if self.split_folders:
            self.train_set = ImageFiles(self._scan(self.root / "train"), train_tf)
            self.val_set = ImageFiles(self._scan(self.root / "val"), eval_tf)
            test_dir = self.root / "test"
            self.test_set = ImageFiles(self._scan(test_dir), eval_tf) if test_dir.is_dir() else self.val_set
        else:
            samples = self._scan(self.root)
            labels = [label for _, label in samples]
            fractions = [self.val_fraction] + ([self.test_fraction] if self.test_fraction > 0 else [])
            parts = stratified_split(labels, fractions, self.seed)
            pick = lambda idx: [samples[i] for i in idx]
            self.train_set = ImageFiles(pick(parts[0]), train_tf)
            self.val_set = ImageFiles(pick(parts[1]), eval_tf)
            self.test_set = ImageFiles(pick(parts[2]), eval_tf) if len(parts) > 2 else self.val_set
        log.info("%s: %d train, %d val, %d test images, %d classes", self.root, len(self.train_set),
                 len(self.val_set), len(self.test_set), self.num_classes)


class ImageNet(ImageFolder):
    """ImageNet-1k (or any dataset) in the ``root/train/<class>/`` + ``root/val/<class>/`` layout
    that timm and torchvision's ImageFolder use, with DeiT's augmentation as defaults."""

    def __init__(
        self,
        root: str,
        skip_bad_images: bool = False,
        batch_size: int = 128,
        num_workers: int = 8,
        img_size: int = 224,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        hflip: float = 0.5,
        color_jitter: float = 0.3,
        scale: tuple[float, float] = (0.08, 1.0),
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        seed: int = 0,
    ) -> None:
        root_path = Path(root)
        for split in ("train", "val"):
            if not (root_path / split).is_dir():
                raise FileNotFoundError(
                    f"ImageNet folder {root_path / split} not found; "
                    f"expected {root_path}/train/<class>/*.JPEG "
                    f"and {root_path}/val/<class>/*.JPEG (the layout of timm and torchvision's ImageFolder)"
                )
        super().__init__(
            root=root, skip_bad_images=skip_bad_images, batch_size=batch_size, num_workers=num_workers,
            img_size=img_size, mean=mean, std=std, auto_augment=auto_augment, re_prob=re_prob,
            hflip=hflip, color_jitter=color_jitter, scale=scale, crop_pct=crop_pct,
            interpolation=interpolation, seed=seed,
        )
