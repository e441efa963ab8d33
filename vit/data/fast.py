"""A cheaper CPU side for timm's training augmentation: the same random draws, uint8 out.

One training image, as a DataLoader worker sees it (timm's ``create_transform`` does the same steps)::

    PIL image (H0, W0), opened        its header read; decoded here, once the crop box is known
      -> enlarged to cover (S, S)       only if smaller (`enlarge_to`): crop boxes are whole source pixels
      -> random resized crop + resize   timm's own box sampler; torch's uint8 antialiased resize (AVX2);
                                        a JPEG >= 4x the output decoded at 1/2-1/8 (`decode_for_crop`)
      -> horizontal flip                torch.rand(1) < p, as torchvision draws it
      -> RandAugment / AutoAugment ...  timm's own objects; shear and translate swapped for exact numpy ops
      -> uint8 tensor (3, S, S)         no float conversion here
    then, batched on the device (`BatchTransform`, called from ``ImageDataModule.on_after_batch_transfer``):
      -> float, normalise (mean, std), random erasing (timm's RandomErasing on the batch)

This is timm's prefetcher split: workers hand over 1 byte per value instead of 4, and the
per-pixel float work runs where it is nearly free. Every random draw on the CPU side is timm's
(same generators, same order), so with the same seeds an image gets the same crop box, flip and
augmentation ops as under timm's transform (tests/data/test_fast.py). Where the pixels differ:

* the resize: torch's antialiased bicubic/bilinear is PIL's filter, applied in PIL's order of
  passes but rounded in another fixed-point order: within 2 grey levels of PIL, and off by one
  on a small share of pixels (docs/speed.md);
* a JPEG whose crop box is at least 4x the output (phone photos, not ImageNet's 500x375): decoded at a
  reduced scale and resized from there by PIL, within a grey level of the whole decode on average;
* nothing else: the numpy shear/translate ops reproduce PIL's bicubic affine bit for bit
  (the same double arithmetic in the same order).

Why these two: they were the loader's largest costs that a faster exact (or near-exact) kernel could
cut (docs/speed.md has the figures). Rotate (both coordinates move) stays PIL's: an exact numpy version
would not be faster.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import default_collate
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from vit.data.io import dct_reduction, decode, exif_orientation

BICUBIC = Image.Resampling.BICUBIC


# ---- exact, fast versions of timm's shear and translate ops ------------------------------------
class _Scratch(threading.local):
    """Arrays reused from call to call (one set per thread): fresh megabyte-sized temporaries
    cost more in page faults than the arithmetic done in them."""

    def __call__(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        arrays = self.__dict__.setdefault("arrays", {})
        a = arrays.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = arrays[name] = np.empty(shape, dtype)
        return a


_scratch = _Scratch()


def _cubic_along_lines(img: Image.Image, pos: np.ndarray, horizontal: bool,
                       fill: Sequence[int]) -> Image.Image | None:
    """PIL's bicubic resampling of an RGB image where only one coordinate moves, bit for bit.

    ``pos`` (H, W) is where each output pixel samples its row (``horizontal``) or its column, in
    PIL's pixel-centre coordinates; the other coordinate stays on the pixel centre, where PIL's
    cubic kernel returns the pixel itself. This follows Pillow's ``bicubic_filter32RGB``
    (libImaging/Geometry.c): kernel a = -1 in Horner form, edge taps clamped, double arithmetic,
    truncation to uint8, and ``fill`` where ``pos`` falls outside the image. Returns None for
    a ``pos`` that is not one shift per line (then PIL does it).
    """
    w, h = img.size
    n = w if horizontal else h  # samples along a line
    along = np.arange(n)
    d = np.subtract(pos, 0.5, out=_scratch("d", (h, w), np.float64))
    first = np.floor(d)
    d -= first  # (H, W) in [0, 1)
    # A pixel's four taps are first - 1 .. first + 2. Shears and translations move each line by one
    # whole offset (plus the fraction d), so all taps are windows of one gathered (n + 3)-long line.
    if horizontal:
        offset = first[:, 0].astype(np.intp)  # (H,)
        if not np.array_equal(first, offset[:, None] + along):
            return None
        index = np.clip(offset[:, None] + np.arange(-1, n + 2), 0, n - 1) + (np.arange(h) * w)[:, None]
    else:
        offset = first[0].astype(np.intp)  # (W,)
        if not np.array_equal(first, offset + along[:, None]):
            return None
        index = np.clip(offset + np.arange(-1, n + 2)[:, None], 0, n - 1) * w + np.arange(w)
    planes = _scratch("planes", (3, h, w), np.uint8)
    for c, band in enumerate(img.split()):
        planes[c] = np.asarray(band)
    lines = _scratch("lines", (3, *index.shape), np.int16)  # (3, H, n + 3) or (3, n + 3, W), edges clamped
    lines[...] = planes.reshape(3, -1).take(index, axis=1)
    v0, v1, v2, v3 = (lines[:, :, k:k + n] if horizontal else lines[:, k:k + n] for k in range(4))
    # Pillow's BICUBIC macro, p1 + d * (p2 + d * (p3 + d * p4)), with p1 = v1, p2 = v2 - v0,
    # p3 = 2 (v0 - v1) + v2 - v3, p4 = v1 - v0 - v2 + v3: small exact integers, then doubles
    a = np.subtract(v1, v0, out=_scratch("a", (3, h, w), np.int16))
    b = np.subtract(v2, v3, out=_scratch("b", (3, h, w), np.int16))
    out = np.subtract(a, b, out=_scratch("out", (3, h, w), np.float64))  # p4
    out *= d
    a *= -2
    a += b
    out += a  # p3
    out *= d
    out += np.subtract(v2, v0, out=b)  # p2
    out *= d
    out += v1  # p1
    np.clip(out, 0, 255, out=out)
    pixels = _scratch("pixels", (3, h, w), np.uint8)
    np.copyto(pixels, out, casting="unsafe")  # truncation, as C's (UINT8) cast
    outside = (pos < 0) | (pos >= n)
    if outside.any():
        np.copyto(pixels, np.asarray(fill, np.uint8)[:, None, None], where=outside)
    return Image.merge("RGB", [Image.fromarray(plane) for plane in pixels])


def affine(img: Image.Image, matrix: Sequence[float], resample: int, fillcolor: Sequence[int] | None) -> Image.Image:
    """``img.transform(img.size, AFFINE, matrix, resample, fillcolor=fillcolor)``, the same pixels, faster
    for RGB bicubic shears and translations along one axis (PIL itself for anything else)."""
    a0, a1, a2, a3, a4, a5 = matrix
    fill = (0, 0, 0) if fillcolor is None else fillcolor
    if img.mode == "RGB" and resample == BICUBIC and isinstance(fill, (tuple, list)) and len(fill) == 3:
        w, h = img.size
        x = np.arange(w) + 0.5  # PIL samples at pixel centres
        y = (np.arange(h) + 0.5)[:, None]
        # The same double expressions as Pillow's affine_transform, so positions round identically.
        out = None
        if (a3, a4, a5) == (0, 1, 0):  # rows move: ShearX, TranslateX
            out = _cubic_along_lines(img, a0 * x + a1 * y + a2, True, fill)
        elif (a0, a1, a2) == (1, 0, 0):  # columns move: ShearY, TranslateY
            out = _cubic_along_lines(img, a3 * x + a4 * y + a5, False, fill)
        if out is not None:
            return out
    return img.transform(img.size, Image.Transform.AFFINE, tuple(matrix), resample=resample, fillcolor=fillcolor)


def _resample(kwargs: dict) -> int:
    """timm's interpolation choice for its geometric ops (a random one when given several)."""
    resample = kwargs.get("resample", BICUBIC)
    return random.choice(resample) if isinstance(resample, (list, tuple)) else resample


def shear_x(img: Image.Image, factor: float, **kwargs) -> Image.Image:
    """timm's ``shear_x``."""
    return affine(img, (1, factor, 0, 0, 1, 0), _resample(kwargs), kwargs.get("fillcolor"))


def shear_y(img: Image.Image, factor: float, **kwargs) -> Image.Image:
    """timm's ``shear_y``."""
    return affine(img, (1, 0, 0, factor, 1, 0), _resample(kwargs), kwargs.get("fillcolor"))


def translate_x_abs(img: Image.Image, pixels: float, **kwargs) -> Image.Image:
    """timm's ``translate_x_abs``."""
    return affine(img, (1, 0, pixels, 0, 1, 0), _resample(kwargs), kwargs.get("fillcolor"))


def translate_y_abs(img: Image.Image, pixels: float, **kwargs) -> Image.Image:
    """timm's ``translate_y_abs``."""
    return affine(img, (1, 0, 0, 0, 1, pixels), _resample(kwargs), kwargs.get("fillcolor"))


def translate_x_rel(img: Image.Image, pct: float, **kwargs) -> Image.Image:
    """timm's ``translate_x_rel``."""
    return translate_x_abs(img, pct * img.size[0], **kwargs)


def translate_y_rel(img: Image.Image, pct: float, **kwargs) -> Image.Image:
    """timm's ``translate_y_rel``."""
    return translate_y_abs(img, pct * img.size[1], **kwargs)


def exact_ops() -> dict[Callable, Callable]:
    """timm's op functions -> ours that give the same pixels, for `vit.data.transforms.swap_ops`."""
    from timm.data import auto_augment as aa

    return {aa.shear_x: shear_x, aa.shear_y: shear_y, aa.translate_x_abs: translate_x_abs,
            aa.translate_y_abs: translate_y_abs, aa.translate_x_rel: translate_x_rel,
            aa.translate_y_rel: translate_y_rel}


# ---- the per-image transform -------------------------------------------------------------------
_TORCH_MODES = {InterpolationMode.BICUBIC: "bicubic", InterpolationMode.BILINEAR: "bilinear"}


def resized_crop(img: Image.Image, box: tuple[float, float, float, float], size: tuple[int, int],
                 interpolation: InterpolationMode, flip: bool = False) -> np.ndarray:
    """torchvision's ``resized_crop`` (crop ``box`` = (top, left, height, width), resize to ``size``)
    and optionally a horizontal flip, as uint8 planes (3, S, S).

    Bicubic and bilinear go through torch's uint8 antialiased kernel (AVX2): PIL's filter, passes
    in PIL's order, rounded in another fixed-point order; within 2 grey levels of PIL, and off by
    one on a small share of pixels (docs/speed.md). A box in fractions of a pixel goes through PIL's resize.
    """
    mode = _TORCH_MODES.get(interpolation)
    top, left, height, width = box
    if any(v != int(v) for v in box):  # fractions of a pixel (`decode_for_crop`): PIL's resize takes such a box
        img = img.resize(size[::-1], Image.Resampling[interpolation.name], box=(left, top, left + width, top + height))
        planes = np.stack([np.asarray(band) for band in img.split()])
    elif mode is None or img.mode != "RGB":
        img = TF.resized_crop(img, *box, list(size), interpolation)
        planes = np.stack([np.asarray(band) for band in img.split()])
    else:
        crop = img.crop((left, top, left + width, top + height))  # a cheap copy in C
        # PIL resizes the height first when it shrinks more than twice as much as the width
        # (Resample.c); torch always starts with the width. Transposing keeps PIL's order, and so its
        # rounding of the intermediate image to uint8.
        transpose = height - size[0] > 0 and height - size[0] > 2 * (width - size[1])
        if transpose:
            crop, size = crop.transpose(Image.Transpose.TRANSPOSE), size[::-1]
        pixels = torch.from_numpy(np.array(crop)).permute(2, 0, 1)[None]  # (1, 3, h, w): AVX2's channels-last
        planes = F.interpolate(pixels, size=size, mode=mode, antialias=True, align_corners=False)[0].numpy()
        if transpose:
            planes = planes.transpose(0, 2, 1)
    if flip:
        planes = planes[:, :, ::-1]
    return np.ascontiguousarray(planes)  # (3, S, S)


def enlarge_to(img: Image.Image, size: tuple[int, int], interpolation: InterpolationMode) -> Image.Image:
    """``img`` resized (aspect kept) so it covers ``size`` (H, W), when it is smaller; else ``img`` itself.

    timm's crop box is whole source pixels: on an 8x8 digit drawn at 32x32 every crop edge moves in steps of
    4 output pixels, a far coarser jitter than the crop means (it cost 8 points of test top-1 on the digits,
    scripts/experiments/parity.py). Enlarging first, as Resize -> RandomResizedCrop does, crops at the output's grain.
    Images at least as large as the output, all of ImageNet's, are untouched.
    """
    w, h = img.size
    scale = max(size[0] / h, size[1] / w)
    if scale <= 1:
        return img
    return TF.resize(img, [max(size[0], round(h * scale)), max(size[1], round(w * scale))], interpolation)


def decode_for_crop(img: Image.Image, box: tuple[int, int, int, int], size: tuple[int, int]
                    ) -> tuple[Image.Image, tuple[float, float, float, float]]:
    """Decode ``img`` (from `vit.data.io.open_image`) for crop ``box`` (top, left, height, width) resized to
    ``size`` (H, W): a JPEG at 1/2, 1/4 or 1/8 scale when the box stays at least twice ``size`` at that scale
    (`vit.data.io.dct_reduction`), else whole. Returns the RGB image and the box in its pixels (fractions of one,
    when reduced).

    A phone's photo decodes at 1/4 (libjpeg's DCT scaling) in about half the time of a whole decode (docs/speed.md,
    "choices measured"), and the resize then reads a sixteenth of the pixels. ``box`` is in the image as shown
    (`decode` turns it as its EXIF orientation says); the scale is the same both ways. The crop comes out within a
    grey level of the whole decode's on average (docs/speed.md). An image already decoded, not a JPEG, or with a
    box under 4x ``size``, is decoded whole: the pixels are then timm's.
    """
    top, left, height, width = box
    reduction = min(dct_reduction(height, size[0]), dct_reduction(width, size[1]))
    if reduction > 1 and img.format == "JPEG":
        w, h = img.size
        drafted = img.draft(None, (w // reduction, h // reduction))  # None: already decoded, nothing done
        if drafted is not None:
            scale = w / drafted[1][2]  # libjpeg's choice: the largest of 1, 2, 4, 8 that keeps the asked size
            return decode(img), (top / scale, left / scale, height / scale, width / scale)
    return decode(img), box


class FastTrainTransform:
    """timm's training transform without its last float steps: PIL RGB image -> uint8 (3, S, S).

    Built from timm's own pieces (``create_transform(..., separate=True)``): its random resized
    crop supplies the box sampler and interpolation, ``ops`` is its RandAugment / AutoAugment /
    AugMix / colour jitter (with exact fast ops swapped in). Normalise and erase with `BatchTransform`.
    The image may come opened but not decoded (`vit.data.io.open_image`): a JPEG much larger than the crop is
    then decoded at a fraction of its size (`decode_for_crop`).
    """

    def __init__(self, crop: Callable, hflip: float, ops: Callable | None = None) -> None:
        self.crop, self.hflip, self.ops = crop, hflip, ops

    def __call__(self, img: Image.Image) -> Tensor:
        crop = self.crop
        interpolation = crop.interpolation
        random_interpolation = isinstance(interpolation, (list, tuple))
        w, h = img.size[::-1] if exif_orientation(img) > 4 else img.size  # as shown: `decode` turns it so
        if w < crop.size[1] or h < crop.size[0]:  # a small image: whole, enlarged
            img = enlarge_to(decode(img), crop.size, InterpolationMode.BICUBIC if random_interpolation
                             else interpolation)
            w, h = img.size
        # timm's draws (python `random`, timm's order), from the size as shown; for a photo stored turned a quarter
        # the sampler gets a tensor of that shape that holds no memory
        shown = img if img.size == (w, h) else torch.empty(()).expand(h, w)
        box = crop.get_params(shown, crop.scale, crop.ratio)
        img, box = decode_for_crop(img, box, crop.size)
        if random_interpolation:
            interpolation = random.choice(interpolation)
        flip = self.hflip > 0 and bool(torch.rand(1) < self.hflip)  # torchvision's RandomHorizontalFlip draw
        planes = resized_crop(img, box, crop.size, interpolation, flip)  # (3, S, S)
        if self.ops is None:
            return torch.from_numpy(planes)
        # timm's augmentations work on PIL images; planes merge into one in C
        img = self.ops(Image.merge("RGB", [Image.fromarray(plane) for plane in planes]))
        # (3, S, S) uint8 view of (S, S, 3) memory: no transposing copy here, nor in `collate`
        return torch.from_numpy(np.array(img)).permute(2, 0, 1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(crop={self.crop}, hflip={self.hflip}, ops={self.ops})"


def collate(batch: list) -> Any:
    """``default_collate``, stacking uint8 images (C, H, W) in (H, W, C) order: a plain copy for the
    channels-last views `FastTrainTransform` returns. Images come out (B, C, H, W), channels-last."""
    image = batch[0][0]
    if isinstance(image, Tensor) and image.dtype == torch.uint8 and image.ndim == 3:
        images, *rest = default_collate([(x.permute(1, 2, 0), *others) for x, *others in batch])
        return [images.permute(0, 3, 1, 2), *rest]
    return default_collate(batch)


# ---- the batched, on-device end ------------------------------------------------------------------
class BatchTransform:
    """uint8 (B, C, H, W) -> normalised float, then timm's random erasing per image (training only).

    The float steps of timm's training transform, run on a whole batch on its device: workers then
    do no per-pixel float work, and move a quarter of the bytes.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], re_prob: float = 0.0,
                 re_mode: str = "pixel") -> None:
        self.mean, self.std, self.re_prob, self.re_mode = tuple(mean), tuple(std), re_prob, re_mode
        self._on_device: dict[torch.device, tuple[Tensor, Tensor, Callable]] = {}

    def _constants(self, device: torch.device) -> tuple[Tensor, Tensor, Callable]:
        """255 mean, 255 std (1, C, 1, 1) and the eraser on ``device``, made once: copying them there
        every batch would wait for the device each time."""
        if device not in self._on_device:
            from timm.data.random_erasing import RandomErasing

            scale = lambda values: (torch.tensor(values) * 255).view(1, -1, 1, 1).to(device)
            eraser = RandomErasing(self.re_prob, mode=self.re_mode, device=device)
            self._on_device[device] = (scale(self.mean), scale(self.std), eraser)
        return self._on_device[device]

    def __call__(self, x: Tensor, erase: bool = True) -> Tensor:
        if x.dtype != torch.uint8 or x.ndim != 4:
            raise ValueError(f"BatchTransform expects uint8 images (B, C, H, W), got {x.dtype} {tuple(x.shape)}")
        mean, std, eraser = self._constants(x.device)
        x = x.float().sub_(mean).div_(std)  # = (x / 255 - mean) / std, as ToTensor + Normalize
        if erase and self.re_prob > 0:
            x = eraser(x)  # timm's RandomErasing, image by image within the batch
        return x

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mean={self.mean}, std={self.std}, re_prob={self.re_prob}, "
                f"re_mode={self.re_mode})")
