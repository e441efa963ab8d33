"""Image files: reading any common mode as RGB, scanning class folders, header checks, splits.

Nothing here imports Lightning, so prediction and export can read images without it. Scanning is
built for ImageNet-sized trees (1.28M files): ``os.scandir`` and plain strings, no ``stat`` per file.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from vit.errors import UserPathError, UserValueError
from vit.preprocessing import too_elongated

log = logging.getLogger(__name__)

# iPhones save HEIC, which PIL reads once the optional pillow-heif (`pip install "vit[heic]"`) registers its reader.
try:
    import pillow_heif
except ImportError:  # HEIC files are then skipped, with what to do (`unreadable_photos_hint`)
    pillow_heif = None
else:
    pillow_heif.register_heif_opener()
READS_HEIC = pillow_heif is not None
HEIF_EXTENSIONS = (".heic", ".heif")

# torchvision's list, and what else Pillow reads that people have in folders: GIF, AVIF (Pillow >= 11.3's wheels;
# an older Pillow's header check names such files), the JPEG names .jfif (what Windows browsers save) and .jpe,
# and HEIC with pillow-heif.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
                    ".gif", ".avif") + (HEIF_EXTENSIONS if READS_HEIC else ())
# Photos PIL cannot read (cameras' RAW formats; HEIC without pillow-heif): skipped, with a word on what to do.
UNREADABLE_PHOTO_EXTENSIONS = (() if READS_HEIC else HEIF_EXTENSIONS) + (
    ".dng", ".cr2", ".cr3", ".nef", ".arw", ".raf", ".orf", ".rw2")


def is_image_file(path: str | os.PathLike) -> bool:
    """Whether the file name has an image extension."""
    return str(path).lower().endswith(IMAGE_EXTENSIONS)


def unreadable_photos_hint(paths: Sequence[str | os.PathLike]) -> str:
    """A sentence on the photos among ``paths`` that PIL cannot read (HEIC, camera RAW), or ""."""
    kinds = sorted({ext for p in paths if (ext := os.path.splitext(str(p))[1].lower()) in UNREADABLE_PHOTO_EXTENSIONS})
    if not kinds:
        return ""
    heic = " (or, for HEIC, `pip install pillow-heif`: vit then reads them)" if set(kinds) & {".heic", ".heif"} else ""
    return (f"PIL does not read {' or '.join(kinds)} photos (iPhones' HEIC, cameras' RAW): convert them to JPEG or "
            f"PNG to use them{heic}")


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


def open_image(source: str | os.PathLike | BinaryIO) -> Image.Image:
    """``source`` opened but not decoded: size, mode and format read from the header (`decode` reads the pixels),
    or an OSError that names the file. Use it as a context manager, which closes the file."""
    try:
        return Image.open(source)
    except Exception as e:  # PIL raises several types for bad files; all mean the same to a user
        raise OSError(f"cannot read image {_name(source)}: {type(e).__name__}: {e}") from e


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation of an opened image, read from its header: 1 (as stored) to 8; 5-8 turn it a quarter,
    so it shows ``img.size`` swapped. Phones store portrait photos landscape with orientation 6 or 8."""
    data = img.info.get("exif")  # what the header gave (JPEG's APP1, WebP's, PNG's before the pixels); not
    if not data:                 # img.getexif(), which decodes a PNG (with junk pixels, then "loaded")
        return 1
    try:
        exif = Image.Exif()
        exif.load(data)
        orientation = exif.get(ExifTags.Base.Orientation, 1)
    except Exception:  # a damaged EXIF block: the pixels may still be fine, so show them as stored
        return 1
    return orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1


def decode(img: Image.Image, mode: str = "RGB") -> Image.Image:
    """The pixels of an image from `open_image` as RGB (or "L"), turned as its EXIF orientation says (as a photo
    viewer shows it), or an OSError that names the file."""
    try:
        turned = exif_orientation(img) != 1
        img.load()
        rgb = to_rgb(ImageOps.exif_transpose(img) if turned else img)  # exif_transpose copies even when upright
    except Exception as e:  # truncated or corrupt data: found only here, as PIL decodes lazily
        source = getattr(img, "filename", "") or getattr(img, "fp", None)  # a path, or a file object
        raise OSError(f"cannot read image {_name(source)}: {type(e).__name__}: {e}") from e
    return rgb.convert("L") if mode == "L" else rgb


def load_image(source: str | os.PathLike | BinaryIO, mode: str = "RGB", short_side: int | None = None) -> Image.Image:
    """Open and decode an image as RGB (or "L"), or raise an OSError that names the file.

    ``short_side``: what the caller resizes the short side to next (the evaluation transform's resize). A JPEG
    at least 4x that is then decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, `dct_reduction`): a
    phone's photo decodes in about half the time (docs/speed.md, "choices measured"), and the resize reads a
    sixteenth of the pixels or fewer.
    """
    with open_image(source) as img:
        w, h = img.size
        if short_side and img.format == "JPEG" and (scale := dct_reduction(min(w, h), short_side)) > 1:
            img.draft(None, (w // scale, h // scale))  # libjpeg takes the largest scale that keeps this size
        return decode(img, mode)


def dct_reduction(side: int, resized: int) -> int:
    """The JPEG decode scale (1, 2, 4 or 8) for an image side that is resized to ``resized`` pixels: the largest
    that leaves the resize at least a halving. Its box filter (an 8x8 block's mean at 1/8) then puts the result
    within a grey level of the whole decode's on average; with less left to the resize, ~1.5-2 levels."""
    return next((scale for scale in (8, 4, 2) if side >= 2 * scale * resized), 1)


def _name(source: object) -> str:
    """A file's path for a message: the path itself, or the ``name`` of a file object (an in-memory one has none)."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    name = getattr(source, "name", None)
    return str(name) if isinstance(name, (str, os.PathLike)) and name else "(in memory)"


# ---- folders ---------------------------------------------------------------------------------
def _hidden(name: str) -> bool:
    """Names that hold no data: dot-files and folders (.ipynb_checkpoints, .DS_Store, macOS's ._* copies) and
    the __MACOSX folder that unzipping an archive made on a Mac leaves beside the real folders."""
    return name.startswith(".") or name == "__MACOSX"


def _files_under(folder: str, seen: set[str] | None = None) -> Iterator[str]:
    """Paths of the visible files below ``folder``, recursively, following links to files and folders.

    A folder reached a second time (a link back up the tree, or two links to one folder) is read once:
    a link loop would otherwise recurse until the OS refuses the path. A link whose target is missing is
    kept, so that the header check reports it, rather than the file vanishing without a word.
    """
    seen = set() if seen is None else seen
    real = os.path.realpath(folder)
    if real in seen:
        log.warning("skipped %s: it leads back to %s, already read", folder, real)
        return
    seen.add(real)
    with os.scandir(folder) as entries:
        for entry in entries:
            if _hidden(entry.name):
                continue
            if entry.is_dir():
                yield from _files_under(entry.path, seen)
            elif entry.is_file() or entry.is_symlink():  # is_file follows links: here the target is missing
                yield entry.path


ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".7z", ".rar")


def require_folder(root: str | os.PathLike) -> None:
    """A clear error when ``root``, where images are expected, is no folder: missing, an archive, or a file."""
    root = Path(root)
    if root.is_dir():
        return
    suffix = next((s for s in ARCHIVE_SUFFIXES if root.name.lower().endswith(s)), None)
    if root.is_file() and suffix is not None:
        folder = root.parent / root.name[: -len(suffix)]
        extract = {".zip": f" (e.g. `unzip {root} -d {folder}`)", ".7z": "", ".rar": ""}.get(
            suffix, f" (e.g. `mkdir {folder} && tar xf {root} -C {folder}`)")
        raise UserPathError(f"{root} is an archive, not a folder: extract it and give the folder{extract}")
    if root.is_file():
        raise UserPathError(f"{root} is a file; give the folder that holds the images")
    raise UserPathError(f"image folder not found: {root}")


def class_folders(root: str | os.PathLike) -> list[str]:
    """Sorted names of the sub-folders of ``root`` (one per class), or a clear error."""
    root = Path(root)
    require_folder(root)
    with os.scandir(root) as entries:
        visible = [e for e in entries if not _hidden(e.name)]
    classes = sorted(e.name for e in visible if e.is_dir())
    if classes:
        return classes
    images = sorted(e.name for e in visible if is_image_file(e.name))
    if not images:
        raise UserValueError(f"{root} has no class sub-folders; expected {root}/<class name>/<image files>")
    imagenet = (" ImageNet's validation images come this way: sort them into class folders by the devkit's labels "
                "first (the widely used valprep.sh does it; so does torchvision.datasets.ImageNet(root, split='val'), "
                "from ILSVRC2012_img_val.tar and ILSVRC2012_devkit_t12.tar.gz in a root without this folder)"
                ) if images[0].startswith("ILSVRC2012_val_") else ""
    raise UserValueError(f"{root} holds {len(images):,} images but no class folders, so they have no labels: "
                         f"expected {root}/<class name>/<image files>.{imagenet}")


def has_split_folders(root: str | os.PathLike) -> bool:
    """Whether ``root`` is the split layout (``root/train/<class>/...``): its train/ holds class folders. A
    train/ of images alone is a class named "train"."""
    train = os.path.join(root, "train")
    if not os.path.isdir(train):
        return False
    with os.scandir(train) as entries:
        return any(e.is_dir() and not _hidden(e.name) for e in entries)


def require_two_classes(root: str | os.PathLike, classes: Sequence[str]) -> None:
    """A clear error for a folder a classifier cannot learn from: fewer than two classes."""
    if len(classes) < 2:
        # Caught here, where the folder is read: deeper down torchmetrics only says num_classes must be > 1.
        raise UserValueError(
            f"a classifier needs at least two classes; {root} has one: {classes[0]}\n"
            f"Add a folder per class ({root}/<class name>/<image files>), two at least."
        )


def scan_class_folders(
    root: str | os.PathLike, classes: Sequence[str], *, allow_empty: bool = False,
) -> list[tuple[str, int]]:
    """(path, label) of the images under ``root/<class>/``, recursively, sorted within each class.

    Files without an image extension are skipped with one warning that counts them; a class
    folder without images is an error, unless ``allow_empty`` (a val or test folder, which may lack
    classes). Nothing is opened: see `check_image_files` for that.
    """
    samples: list[tuple[str, int]] = []
    not_images: list[str] = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            raise UserValueError(f"class {name!r} has no folder {folder}")
        found, skipped = 0, []
        # a link inside a class back up to root would pull the other classes' images into this one
        for path in sorted(_files_under(folder, seen={os.path.realpath(root)})):
            if is_image_file(path):
                samples.append((path, label))
                found += 1
            else:
                skipped.append(path)
        if found == 0 and not allow_empty:
            hint = unreadable_photos_hint(skipped)
            raise UserValueError(f"class folder {folder} has no images (expected files like *.jpg, *.png)"
                                 + (f"; {hint}" if hint else ""))
        if found == 0:
            log.warning("class folder %s has no images: %s has none of class %r", folder, root, name)
        not_images += skipped
    if not_images:
        kinds = Counter(os.path.splitext(p)[1].lower() or os.path.basename(p) for p in not_images)
        hint = unreadable_photos_hint(not_images)
        # one log line, not a Python warning with its source line: nothing is wrong with the data
        log.warning("skipped %d files under %s that are not images (%s)%s", len(not_images), root,
                    ", ".join(f"{n} {k}" for k, n in kinds.most_common()), f"; {hint}" if hint else "")
    return samples


@dataclass
class FoundImages:
    """What `find_images` found: image files, and per input folder the files skipped as not images."""

    files: list[Path]
    skipped: dict[str, list[str]] = field(default_factory=dict)  # input folder -> its non-image files

    def describe_skipped(self) -> list[str]:
        """One line per folder that held non-image files, e.g. "skipped 1 non-image file in photos (e.g. notes.txt)"."""
        lines = []
        for folder, paths in self.skipped.items():
            examples = ", ".join(os.path.relpath(p, folder) for p in paths[:3])
            noun = "file" if len(paths) == 1 else "files"
            hint = unreadable_photos_hint(paths)
            lines.append(f"skipped {len(paths)} non-image {noun} in {folder} (e.g. {examples})"
                         + (f"; {hint}" if hint else ""))
        return lines


def find_images(inputs: Sequence[str | os.PathLike]) -> FoundImages:
    """Image files among ``inputs`` (files, or folders searched recursively), in a stable order.

    Files named on their own are kept whatever their extension (the caller asked for them); in folders,
    files without an image extension are skipped and counted. A file reached twice (``photos/ photos/a.jpg``,
    a folder named twice) is kept once, where it first came: one answer per file. Nothing is opened.
    """
    found = FoundImages(files=[])
    seen: set[str] = set()

    def keep(path: Path) -> None:
        if (key := os.path.abspath(path)) not in seen:
            seen.add(key)
            found.files.append(path)

    for item in map(Path, inputs):
        if item.is_dir():
            for path in sorted(_files_under(str(item))):
                if is_image_file(path):
                    keep(Path(path))
                else:
                    found.skipped.setdefault(str(item), []).append(path)
        elif item.is_file():
            keep(item)
        else:
            raise UserPathError(f"no such image file or folder: {item}")
    if not found.files:
        raise UserValueError(f"no image files found in {', '.join(map(str, inputs))}")
    return found


# ---- header checks ---------------------------------------------------------------------------
def pil_refusal_limit() -> int:
    """The pixel count over which PIL's ``Image.open`` raises DecompressionBombError: twice its MAX_IMAGE_PIXELS
    (between once and twice it only warns)."""
    return 2 * (Image.MAX_IMAGE_PIXELS or 0)


def bomb_size(error: Image.DecompressionBombError) -> str:
    """The image size PIL's error names ("Image size (199756800 pixels) exceeds limit of ..."), as "199,756,800
    pixels"."""
    pixels = re.search(r"\((\d+) pixels\)", str(error))
    return f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"


def check_image_file(path: str, short_side: int | None = None) -> str | None:
    """What is wrong with an image file, judged from its header alone (no decoding), or None.

    Finds empty files, content that is no image format PIL reads (a text file named .jpg, an
    unsupported format) and images PIL refuses to open as decompression bombs (over twice its
    MAX_IMAGE_PIXELS, 179 MP). Between once and twice that PIL only warns, as for the 108 MP photos of
    some phones, which load as they would in torchvision or timm. Truncated pixel data passes: only
    decoding finds it. With ``short_side`` (what training and evaluation scale the short side to, at most),
    so is an image so elongated that the scaling would blow it up (`too_elongated`: a loader's MemoryError).
    """
    try:
        if os.path.getsize(path) == 0:
            return "empty file (0 bytes)"
        with Image.open(path) as img:
            size = img.size
        if short_side and (problem := too_elongated(*size, short_side)):
            return problem
    except Image.DecompressionBombError as e:
        return f"{bomb_size(e)}, over PIL's limit of {pil_refusal_limit():,} (a decompression-bomb guard); " \
               "downscale it"
    except UnidentifiedImageError:
        if path.lower().endswith(ARCHIVE_SUFFIXES):
            return "an archive, not an image: extract it and give the images in it"
        return unreadable_photos_hint([path]) or "not an image in a format PIL reads"
    except Exception as e:  # anything else a header can do wrong
        return f"unreadable header ({type(e).__name__}: {e})"
    return None


def _check_chunk(paths: Sequence[str], short_side: int | None = None) -> list[tuple[str, str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return [(p, problem) for p in paths if (problem := check_image_file(p, short_side)) is not None]


def check_image_files(paths: Sequence[str], num_workers: int | None = None, short_side: int | None = None
                      ) -> list[tuple[str, str]]:
    """(path, problem) for every file whose header is bad (`check_image_file`), checked in ``num_workers``
    processes. ``None`` uses every core this process may run on; small lists are checked in-process.
    """
    num_workers = len(os.sched_getaffinity(0)) if num_workers is None else num_workers
    if num_workers <= 1 or len(paths) < 2000:
        return _check_chunk(paths, short_side)
    import multiprocessing

    chunks = [paths[i : i + 500] for i in range(0, len(paths), 500)]
    # fork: the workers need nothing but PIL, and must not re-import the caller's program.
    with ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return [bad for result in pool.map(partial(_check_chunk, short_side=short_side), chunks) for bad in result]


def describe_bad_files(bad: Sequence[tuple[str, str]], total: int, shown: int = 10) -> str:
    """A count and the first bad files with their problems, one per line."""
    lines = [f"{len(bad)} of {total} image files are unreadable:"]
    lines += [f"  {path}: {problem}" for path, problem in bad[:shown]]
    if len(bad) > shown:
        lines.append(f"  ... and {len(bad) - shown} more")
    return "\n".join(lines)


# ---- splits ----------------------------------------------------------------------------------
def stratified_split(labels: Sequence[int], fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Split indices so each part keeps the class proportions; returns [rest, part1, part2, ...].

    Within each class the indices are shuffled with ``seed`` and each part takes
    ``round(fraction * class_count)`` of them (at least one when the class has two or more), always
    leaving one for the rest: a class of two images split 80/10/10 keeps one to train on.
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
            n = min(n, len(idx) - start - 1)  # the rest (training) keeps at least one image of every class
            parts[i + 1].extend(idx[start:start + n].tolist())
            start += n
        parts[0].extend(idx[start:].tolist())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
