"""CIFAR-10 and CIFAR-100 in torchvision's on-disk format (the "python version" pickles)."""

from __future__ import annotations

import pickle
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import Dataset
from torchvision.datasets import CIFAR10 as CIFAR10Dataset
from torchvision.datasets import CIFAR100 as CIFAR100Dataset

from vit.data.base import ImageDataModule
from vit.data.fingerprint import fingerprint
from vit.data.io import stratified_split
from vit.errors import UserPathError, UserValueError

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)

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


class TransformedSubset(Dataset):
    """A subset of a dataset of (PIL image, label), with its own transform."""

    def __init__(self, dataset: Dataset, indices: Sequence[int], transform: Callable | None) -> None:
        self.dataset = dataset
        self.indices = list(indices)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def labels(self) -> list[int]:
        """The label of every sample, without decoding any image."""
        targets = self.dataset.targets
        return [int(targets[i]) for i in self.indices]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img, label = self.dataset[self.indices[index]]
        return (self.transform(img) if self.transform else img), int(label)

    def fingerprint(self) -> str:
        """A hash of the indices, the underlying images and labels, and the transform."""
        inner = self.dataset
        return fingerprint(type(self).__name__, repr(self.transform), np.asarray(self.indices),
                           np.asarray(inner.data), np.asarray(inner.targets))

    def item_name(self, index: int) -> str:
        """``<dataset>[i]``: the image's position in the underlying dataset."""
        return f"{type(self.dataset).__name__}[{self.indices[index]}]"

    def raw_image(self, index: int) -> Any:
        """Item ``index`` as the underlying dataset gives it (a PIL image), untransformed."""
        return self.dataset[self.indices[index]][0]


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
        root: folder that holds (or will hold) the extracted dataset; the extracted folder itself
            (``.../cifar-10-batches-py``) is read too, and an archive downloaded by hand
            (``root/cifar-10-python.tar.gz``) is extracted beside it, offline.
        variant: 10 or 100.
        download: fetch the dataset when it is missing (needs internet).
        val_size: training images held out for validation (0 = validate on the test set).
        batch_size: images per batch (per device).
        img_size: side of the images the model sees. None: the pretrained weights' under `vit fit` (see
            ``ImageDataModule``), else 32, CIFAR's own.
        mean: normalisation mean per channel. None: the pretrained weights', else CIFAR's.
        std: normalisation standard deviation per channel. None: the pretrained weights', else CIFAR's.
        color_jitter: colour-jitter strength, 0 = off.
        scale: range of the random resized crop's area fraction.
        crop_pct: evaluation centre crop. None: the pretrained weights', else 1.0 (the whole image).
    """

    def __init__(
        self,
        root: str = "data",
        variant: int = 10,
        download: bool = False,
        val_size: int = 5000,
        *,
        batch_size: int = 128,
        img_size: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        color_jitter: float = 0.0,
        scale: tuple[float, float] = (0.6, 1.0),
        crop_pct: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, img_size=32 if img_size is None else img_size,
                         mean=CIFAR_MEAN if mean is None else mean, std=CIFAR_STD if std is None else std,
                         color_jitter=color_jitter, scale=scale, crop_pct=1.0 if crop_pct is None else crop_pct,
                         **kwargs)
        if variant not in (10, 100):
            raise UserValueError(f"CIFAR variant must be 10 or 100, got {variant}")
        self.root, self.variant, self.download, self.val_size = Path(root).expanduser(), variant, download, val_size
        if self.root.name == self.folder.name:  # the extracted folder itself, rather than the folder that holds it
            self.root = self.root.parent
        self.class_names = list(CIFAR10_CLASSES if variant == 10 else CIFAR100_CLASSES)

    @property
    def folder(self) -> Path:
        """Where torchvision keeps the extracted files."""
        return self.root / ("cifar-10-batches-py" if self.variant == 10 else "cifar-100-python")

    @property
    def archive(self) -> Path:
        """The archive torchvision downloads into ``root`` (cifar-10-python.tar.gz), which a user may have fetched
        by hand."""
        return self.root / (CIFAR10Dataset if self.variant == 10 else CIFAR100Dataset).filename

    def _extract(self) -> None:
        """Unpack ``archive`` when it is there and the extracted folder is not (no network needed)."""
        if self.folder.is_dir() or not self.archive.is_file():
            return
        from torchvision.datasets.utils import extract_archive

        rank_zero_info(f"extracting {self.archive} into {self.root}")
        try:
            extract_archive(str(self.archive), str(self.root))
        except (tarfile.TarError, EOFError, OSError) as e:
            raise UserValueError(f"{self.archive} cannot be extracted ({type(e).__name__}: {e}); it is probably "
                                 "cut short: download it again, or set `download: true`") from e

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
            raise UserPathError(
                f"CIFAR-{self.variant} not found in {self.folder} (missing: {', '.join(missing) or 'none'}; "
                f"expected {', '.join(self.expected_files)}). {hint}"
                f"put the extracted python version of CIFAR-{self.variant} there. ({type(e).__name__}: {e})"
            ) from e
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as e:
            raise UserValueError(
                f"{self.folder}: a CIFAR-{self.variant} file is damaged or not in the python pickle format "
                f"({type(e).__name__}: {e}); delete the folder and download it again"
            ) from e

    def prepare_data(self) -> None:
        self._extract()
        if self.download:
            self._dataset(train=True, download=True)
            self._dataset(train=False, download=True)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self._extract()  # (done by prepare_data under a Trainer; here for setup called on its own)
        train_full = self._dataset(train=True, download=False)
        test = self._dataset(train=False, download=False)
        if list(train_full.classes) != self.class_names:
            raise UserValueError(
                f"{self.folder}: class names in the meta file {list(train_full.classes)[:5]}... differ "
                f"from CIFAR-{self.variant}'s {self.class_names[:5]}..."
            )
        if self.val_size > 0:
            if self.val_size >= len(train_full):
                raise UserValueError(f"val_size {self.val_size} leaves no training images of {len(train_full)}")
            train_idx, val_idx = stratified_split(
                train_full.targets, [self.val_size / len(train_full)], self.seed
            )
            self.val_set = TransformedSubset(train_full, val_idx, self.eval_transform())
        else:
            train_idx = np.arange(len(train_full))
            self.val_set = TransformedSubset(test, range(len(test)), self.eval_transform())
        self.train_set = TransformedSubset(train_full, train_idx, self.train_transform())
        self.test_set = TransformedSubset(test, range(len(test)), self.eval_transform())
