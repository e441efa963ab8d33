"""The fast training pipeline is timm's augmentation: exact where it says so, and the same batches otherwise.

The references are timm's own ``create_transform`` (its prefetcher variant for uint8 images, and
its full variant for normalised, erased tensors) and PIL itself, on real photos (sklearn's samples).
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import auto_augment as aa
from timm.data import create_transform

from vit.data import fast
from vit.data.stream import seed_all
from vit.data.transforms import IMAGENET_MEAN, IMAGENET_STD, Augmentation, guard_posterize, train_transform

POLICY = "rand-m9-mstd0.5-inc1"


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    """sklearn's two sample photos (427x640), a 500x375 and two smaller resizes: real image statistics."""
    from sklearn.datasets import load_sample_images

    china, flower = (Image.fromarray(a) for a in load_sample_images().images)
    return [china, flower, china.resize((500, 375)), china.resize((240, 320)), flower.resize((300, 200))]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- exact ops ------------------------------------------------------------------------------------
OPS = [(aa.shear_x, fast.shear_x, 0.3), (aa.shear_y, fast.shear_y, 0.3),
       (aa.translate_x_rel, fast.translate_x_rel, 0.45), (aa.translate_y_rel, fast.translate_y_rel, 0.45),
       (aa.translate_x_abs, fast.translate_x_abs, 100.0), (aa.translate_y_abs, fast.translate_y_abs, 100.0)]


@pytest.mark.parametrize(("timm_op", "our_op", "limit"), OPS, ids=lambda v: getattr(v, "__name__", ""))
def test_shear_and_translate_give_pils_pixels_bit_for_bit(timm_op, our_op, limit, photos):
    """Random magnitudes up to past timm's extremes, odd sizes, flat and noisy images, both fill kinds."""
    rng = np.random.default_rng(0)
    images = [photos[2].resize((224, 224)), photos[3].crop((0, 0, 61, 37)),
              Image.fromarray(rng.integers(0, 256, (29, 45, 3), dtype=np.uint8)),
              Image.fromarray(np.full((16, 24, 3), 200, np.uint8))]
    for image in images:
        for magnitude in [*rng.uniform(-limit, limit, 8), limit, -limit, 0.0, 3 * limit]:
            for fill in [(124, 116, 104), None]:
                kwargs = {"resample": Image.Resampling.BICUBIC, "fillcolor": fill}
                expected = np.asarray(timm_op(image, magnitude, **kwargs))
                assert np.array_equal(np.asarray(our_op(image, magnitude, **kwargs)), expected), (magnitude, fill)


def test_fast_ops_draw_like_timm_and_leave_other_cases_to_pil(photos):
    """A random choice of interpolation consumes the same draw; bilinear and non-RGB go to PIL as given."""
    image = photos[2].resize((64, 48))
    both = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
    for seed in range(6):
        random.seed(seed)
        expected, after = np.asarray(aa.shear_x(image, 0.2, resample=both, fillcolor=(1, 2, 3))), random.random()
        random.seed(seed)
        got = np.asarray(fast.shear_x(image, 0.2, resample=both, fillcolor=(1, 2, 3)))
        assert np.array_equal(got, expected) and random.random() == after
    gray = image.convert("L")
    assert np.array_equal(np.asarray(fast.translate_y_rel(gray, 0.3, resample=Image.Resampling.BICUBIC)),
                          np.asarray(aa.translate_y_rel(gray, 0.3, resample=Image.Resampling.BICUBIC)))


# ---- resize ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_resized_crop_is_pils_within_two_grey_levels(interpolation, photos):
    from torchvision.transforms import InterpolationMode

    mode = InterpolationMode(interpolation)
    image = photos[2]  # 500x375
    for top, left, height, width in [(50, 100, 300, 300), (100, 200, 130, 130), (0, 0, 375, 500), (10, 5, 300, 90)]:
        planes = fast.resized_crop(image, (top, left, height, width), (224, 224), mode)
        reference = image.crop((left, top, left + width, top + height)).resize((224, 224), getattr(
            Image.Resampling, interpolation.upper()))
        diff = np.abs(planes.transpose(1, 2, 0).astype(int) - np.asarray(reference))
        assert diff.max() <= 2 and (diff > 0).mean() < 0.02
        flipped = fast.resized_crop(image, (top, left, height, width), (224, 224), mode, flip=True)
        assert np.array_equal(flipped, planes[:, :, ::-1])
    nearest = fast.resized_crop(image, (50, 100, 300, 300), (224, 224), InterpolationMode.NEAREST)
    assert np.array_equal(nearest.transpose(1, 2, 0), np.asarray(image.crop((100, 50, 400, 350)).resize(
        (224, 224), Image.Resampling.NEAREST)))


# ---- the whole training transform -----------------------------------------------------------------
def reference_transform(size: int, **kwargs):
    """timm's training transform (guarded against the Pillow-13 posterize crash), as we configure it."""
    return guard_posterize(create_transform(size, is_training=True, auto_augment=POLICY, interpolation="bicubic",
                                            mean=IMAGENET_MEAN, std=IMAGENET_STD, **kwargs))


def record_boxes(crop) -> list:
    """Make a RandomResizedCropAndInterpolation remember every crop box it draws."""
    boxes, draw = [], crop.get_params
    crop.get_params = lambda *args: boxes.append(draw(*args)) or boxes[-1]
    return boxes


def test_training_transform_follows_timm_image_by_image(photos):
    """Same seeds, same draws: the same crop boxes, flips and ops as timm's prefetcher transform, so
    every image matches timm's up to the resize's rounding (which a posterize or solarize threshold
    can turn into a visible step on a few pixels)."""
    size = 112
    reference = reference_transform(size, use_prefetcher=True)  # uint8 (3, S, S), no normalise / erase
    ours = train_transform(Augmentation(auto_augment=POLICY), size, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
    theirs_boxes, our_boxes = record_boxes(reference.transforms[0]), record_boxes(ours.crop)
    mean_diffs, equal = [], []
    for i in range(120):
        image = photos[3 + i % 2]
        seed_all(i)
        expected = reference(image)
        seed_all(i)
        got = ours(image)
        assert got.shape == expected.shape == (3, size, size) and got.dtype == torch.uint8
        diff = (got.int() - expected.int()).abs().float()
        mean_diffs.append(diff.mean().item())
        equal.append((diff == 0).float().mean().item())
    # the crop scale distribution is timm's; flips are too (a flipped image would differ by far more)
    assert our_boxes == theirs_boxes and len(set(our_boxes)) > 110
    assert np.mean(mean_diffs) < 0.05 and max(mean_diffs) < 0.5, (np.mean(mean_diffs), max(mean_diffs))
    assert np.mean(equal) > 0.98, np.mean(equal)


def test_images_smaller_than_the_output_are_enlarged_before_the_crop(photos):
    """An 8x8 digit at 32x32: the crop box is drawn on the image enlarged to 32x32 (torchvision's Resize ->
    RandomResizedCrop), so crops move in output pixels, not in steps of 4; larger images are untouched."""
    from sklearn.datasets import load_digits
    from torchvision.transforms import InterpolationMode

    digit = Image.fromarray((load_digits().images[0] * 255 / 16).astype(np.uint8)).convert("RGB")
    plain = Augmentation(auto_augment=None, hflip=0.0, color_jitter=0.0, scale=(0.5, 1.0))
    ours = train_transform(plain, 32, "bilinear", (0.5,) * 3, (0.5,) * 3)
    boxes = record_boxes(ours.crop)
    enlarged = digit.resize((32, 32), Image.Resampling.BILINEAR)
    for i in range(20):
        seed_all(i)
        got = ours(digit).numpy().transpose(1, 2, 0).astype(int)
        top, left, height, width = boxes[-1]
        expected = enlarged.crop((left, top, left + width, top + height)).resize((32, 32), Image.Resampling.BILINEAR)
        assert np.abs(got - np.asarray(expected)).max() <= 2
    assert len({(h, w) for _, _, h, w in boxes}) > 10  # box sides in output pixels, not multiples of 4
    assert fast.enlarge_to(digit, (32, 32), InterpolationMode.BILINEAR).size == (32, 32)
    assert fast.enlarge_to(digit.resize((10, 20)), (32, 32), InterpolationMode.BILINEAR).size == (32, 64)
    assert fast.enlarge_to(photos[3], (224, 224), InterpolationMode.BICUBIC) is photos[3]


def test_batch_transform_normalises_like_to_tensor_and_normalize():
    from torchvision.transforms import Normalize

    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    expected = Normalize(IMAGENET_MEAN, IMAGENET_STD)(x.float() / 255)
    got = fast.BatchTransform(IMAGENET_MEAN, IMAGENET_STD, re_prob=1.0)(x, erase=False)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="uint8 images"):
        fast.BatchTransform(IMAGENET_MEAN, IMAGENET_STD)(x.float())


def erased_stats(erased: torch.Tensor, clean: torch.Tensor) -> tuple[float, float, float]:
    """Share of images erased, mean erased area of those, std of the erased values."""
    changed = (erased != clean).any(1)  # (B, H, W)
    area = changed.float().mean((1, 2))
    hit = area > 0
    return hit.float().mean().item(), area[hit].mean().item(), erased.permute(0, 2, 3, 1)[changed].std().item()


def test_batch_erasing_is_timms_per_image_erasing():
    """The same RandomErasing on the whole batch, or image by image in the worker, erases alike."""
    from timm.data.random_erasing import RandomErasing

    torch.manual_seed(0)
    random.seed(0)
    clean = torch.zeros(2000, 3, 24, 24)
    ours = fast.BatchTransform((0.0,) * 3, (1 / 255,) * 3, re_prob=0.25)(torch.zeros_like(clean, dtype=torch.uint8))
    per_image = RandomErasing(0.25, mode="pixel", device="cpu")
    theirs = torch.stack([per_image(x.clone()) for x in clean])
    (p1, a1, s1), (p2, a2, s2) = erased_stats(ours, clean), erased_stats(theirs, clean)
    assert abs(p1 - 0.25) < 0.04 and abs(p2 - 0.25) < 0.04 and abs(a1 - a2) < 0.03 and abs(s1 - s2) < 0.05


def test_training_batches_match_timms_statistics(tmp_path, photos):
    """The whole path, files to normalised, erased batch: per-channel mean and std, and erased share,
    against torchvision's ImageFolder with timm's full transform on the same JPEGs."""
    from torchvision.datasets import ImageFolder as TorchvisionFolder

    from vit.data import ImageFolder

    for split in ("train", "val"):
        for c, photo in enumerate(photos[3:]):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            for i in range(4 if split == "train" else 1):
                photo.rotate(90 * i, expand=True).save(tmp_path / split / f"c{c}" / f"{i}.jpg", quality=90)
    dm = ImageFolder(str(tmp_path), batch_size=8, num_workers=0, img_size=64, auto_augment=POLICY, re_prob=0.25)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(training=True)  # as Lightning's fit loop, for on_after_batch_transfer
    folder = str(tmp_path / "train")
    reference = TorchvisionFolder(folder, transform=reference_transform(64, re_prob=0.25, re_mode="pixel"))
    reference_clean = TorchvisionFolder(folder, transform=reference_transform(64))
    n = 128
    raw = []
    for i in range(n):  # seeded image by image, as below, so both sides crop and augment alike
        seed_all(i)
        raw.append(dm.train_set[i % len(dm.train_set)])
    raw = fast.collate(raw)  # uint8, as a worker hands it over
    ours = dm.on_after_batch_transfer(raw, 0)[0]
    dm.trainer.training = False  # validation on the training loader: normalised, not erased
    ours_clean = dm.on_after_batch_transfer(raw, 0)[0]
    theirs, theirs_clean = [], []
    for i in range(n):  # the same draws with and without the final erasing step
        seed_all(i)
        theirs.append(reference[i % len(reference)][0])
        seed_all(i)
        theirs_clean.append(reference_clean[i % len(reference)][0])
    theirs, theirs_clean = torch.stack(theirs), torch.stack(theirs_clean)
    assert ours.dtype == torch.float32 and ours.shape == theirs.shape == (n, 3, 64, 64)
    for stat in (lambda x: x.mean((0, 2, 3)), lambda x: x.std((0, 2, 3))):
        torch.testing.assert_close(stat(ours_clean), stat(theirs_clean), atol=1e-3, rtol=0)
        torch.testing.assert_close(stat(ours), stat(theirs), atol=0.05, rtol=0)  # erasing draws differ
    for erased, clean in ((ours, ours_clean), (theirs, theirs_clean)):  # test_batch_erasing_... compares closer
        share, area, _ = erased_stats(erased, clean)
        assert abs(share - 0.25) < 0.12 and 0.1 < area < 0.26, (share, area)



def test_collate_stacks_channels_last_views_as_they_are():
    hwc = torch.randint(0, 256, (4, 6, 5, 3), dtype=torch.uint8)
    batch = [(x.permute(2, 0, 1), i) for i, x in enumerate(hwc)]  # what FastTrainTransform hands over
    images, labels = fast.collate(batch)
    assert torch.equal(images, torch.stack([x for x, _ in batch])) and labels.tolist() == [0, 1, 2, 3]
    assert images.is_contiguous(memory_format=torch.channels_last)
    floats = [(torch.rand(3, 5, 6), 0), (torch.rand(3, 5, 6), 1)]  # evaluation batches: default_collate
    assert torch.equal(fast.collate(floats)[0], torch.stack([x for x, _ in floats]))


def test_datamodule_normalises_uint8_batches_and_erases_only_in_training(tmp_path, photos):
    from vit.data import ImageFolder

    for c, photo in enumerate(photos[3:]):
        (tmp_path / f"c{c}").mkdir()
        for i in range(5):
            photo.save(tmp_path / f"c{c}" / f"{i}.jpg")
    dm = ImageFolder(str(tmp_path), batch_size=4, num_workers=0, img_size=32, re_prob=1.0, val_fraction=0.4)
    dm.setup("fit")
    raw = next(iter(dm.train_dataloader()))
    assert raw[0].dtype == torch.uint8 and raw[0].shape == (4, 3, 32, 32)  # the workers' share of the work
    normalised = fast.BatchTransform(dm.mean, dm.std)(raw[0], erase=False)
    assert torch.equal(dm.on_after_batch_transfer(raw, 0)[0], normalised)  # no trainer: not erased
    dm.trainer = SimpleNamespace(training=False)
    assert torch.equal(dm.on_after_batch_transfer(raw, 0)[0], normalised)  # validating: not erased
    dm.trainer.training = True
    erased = dm.on_after_batch_transfer(raw, 0)[0]
    assert all((erased[i] != normalised[i]).any() for i in range(4))  # re_prob 1: every image erased
    val = next(iter(dm.val_dataloader()))
    assert val[0].dtype == torch.float32 and dm.on_after_batch_transfer(val, 0)[0] is val[0]  # eval: untouched


# ---- JPEGs much larger than the crop --------------------------------------------------------------
def big_jpeg(path, photo: Image.Image, size=(1600, 1200), mode="RGB", **save) -> Path:
    """``photo`` enlarged to a size well over the crop's, with a camera's grain (3 grey levels), as a JPEG."""
    rng = np.random.default_rng(0)
    pixels = np.asarray(photo.resize(size, Image.Resampling.BICUBIC)).astype(float) + rng.normal(0, 3, (*size[::-1], 3))
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert(mode).save(path, quality=90, **save)
    return path


def record_decoded_sizes(monkeypatch) -> list:
    """Make `vit.data.fast` remember the size of every image it decodes."""
    sizes, decode = [], fast.decode
    monkeypatch.setattr(fast, "decode", lambda img: sizes.append(img.size) or decode(img))
    return sizes


@pytest.mark.parametrize("kind", ["rgb", "progressive", "grey", "cmyk", "portrait5", "portrait6", "portrait7",
                                  "portrait8"])
def test_a_jpeg_much_larger_than_the_crop_decodes_reduced_and_crops_as_timm_does_from_the_whole(
        kind, tmp_path, photos, monkeypatch):
    """A phone-sized JPEG, opened but not decoded, is decoded at 1/2-1/8 scale where the crop box allows; the
    crop is timm's crop of the whole decode (same draws, same box) within a grey level on average (0.5 measured;
    the DCT scaling and the wide bicubic filter smooth the camera's grain apart). A box rounded to whole reduced
    pixels is 2.4 off on average (measured), so the bar below tells the two apart. Every EXIF orientation that
    turns the picture a quarter is tried: 6 and 8 (turned), 5 and 7 (turned and mirrored)."""
    from vit.data.io import load_image, open_image

    portrait = Image.Exif()
    if kind.startswith("portrait"):
        portrait[0x0112] = int(kind[-1])  # stored landscape, shown turned a quarter: a phone's portrait photo
    mode, save = {"rgb": ("RGB", {}), "progressive": ("RGB", {"progressive": True}), "grey": ("L", {}),
                  "cmyk": ("CMYK", {})}.get(kind, ("RGB", {"exif": portrait}))
    path = big_jpeg(tmp_path / "photo.jpg", photos[0], mode=mode, **save)
    stored = Image.open(path).size
    size = 64
    plain = Augmentation(auto_augment=None, color_jitter=0.0)  # the crop and flip: the ops act on the crop after
    ours = train_transform(plain, size, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
    reference = create_transform(size, is_training=True, interpolation="bicubic", separate=True)[0]  # crop, flip
    whole = load_image(path)  # as shown: timm's transform of it is the reference (timm itself ignores EXIF)
    assert whole.size == (stored[::-1] if kind.startswith("portrait") else stored)
    decoded = record_decoded_sizes(monkeypatch)
    diffs = []
    for i in range(24):
        seed_all(i)
        expected = np.asarray(reference(whole)).astype(float)  # PIL (S, S, 3)
        seed_all(i)
        with open_image(path) as img:
            got = ours(img).numpy().transpose(1, 2, 0).astype(float)
        diffs.append(np.abs(got - expected).mean())
    reduced = [s for s in decoded if s[0] < stored[0]]
    assert len(reduced) >= 20 and min(s[0] for s in reduced) == stored[0] // 8, decoded  # 1/2 .. 1/8
    assert np.mean(diffs) < 1.0 and max(diffs) < 2.0, np.round(diffs, 2)
    seed_all(0)
    assert torch.equal(ours(whole), (seed_all(0), ours(whole))[1])  # a decoded image: whole, as before
    assert decoded[-1] == whole.size


@pytest.mark.parametrize("source", ["folder", "shards"])
def test_training_splits_hand_the_transform_undecoded_images_and_eval_splits_decoded_ones(
        source, tmp_path, photos, monkeypatch):
    from vit.data import ImageFolder, ImageShards
    from vit.data.shards import write_shards

    for c in ("a", "b"):
        (tmp_path / "photos" / c).mkdir(parents=True)
        for i in range(4):
            big_jpeg(tmp_path / "photos" / c / f"{i}.jpg", photos[i % 2], size=(800, 600))
    opts = dict(batch_size=2, num_workers=0, img_size=32, val_fraction=0.25)
    if source == "shards":
        write_shards(tmp_path / "photos", tmp_path / "shards", num_workers=1, val_fraction=0.25)
        dm = ImageShards(str(tmp_path / "shards"), **{k: v for k, v in opts.items() if k != "val_fraction"})
    else:
        dm = ImageFolder(str(tmp_path / "photos"), **opts)
    dm.setup("fit")
    decoded = record_decoded_sizes(monkeypatch)
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 32, 32) and all(w < 800 for w, _ in decoded), decoded
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape[1:] == (3, 32, 32) and len(decoded) == 2  # the evaluation transform decodes whole, in load_image
