"""Reading images in any mode, splits (vit.data.io)."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from vit.data.io import load_image, stratified_split, to_rgb


def test_stratified_split_keeps_class_shares_and_is_seeded():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    rest, val, test = stratified_split(labels, [0.1, 0.2], seed=3)
    assert sorted(np.concatenate([rest, val, test]).tolist()) == list(range(100))
    assert Counter(labels[val].tolist()) == {0: 1, 1: 2, 2: 3, 3: 4}
    assert Counter(labels[test].tolist()) == {0: 2, 1: 4, 2: 6, 3: 8}
    again = stratified_split(labels, [0.1, 0.2], seed=3)
    assert all((a == b).all() for a, b in zip(again, (rest, val, test)))
    other = stratified_split(labels, [0.1, 0.2], seed=4)
    assert not (other[1] == val).all()


@pytest.mark.parametrize("count", [1, 2, 3])
def test_stratified_split_leaves_every_class_an_image_to_train_on(count):
    """A class of 2 or 3 images split 80/10/10 gave one to val and one to test, and with 2 none to train."""
    labels = np.repeat(np.arange(2), [40, count])
    rest, val, test = stratified_split(labels, [0.1, 0.1], seed=0)
    held_out = {1: (0, 0), 2: (1, 0), 3: (1, 1)}[count]  # val first, then test, while one is left to train
    assert (Counter(labels[val].tolist())[1], Counter(labels[test].tolist())[1]) == held_out
    assert Counter(labels[rest].tolist())[1] == count - sum(held_out) >= 1
    assert Counter(labels[rest].tolist())[0] == 32  # a large class splits as before


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "I;16", "1", "LA"])
def test_every_common_mode_becomes_rgb(mode, tmp_path):
    from tests.formats import MODE_FILES, image_in_mode

    img = image_in_mode(mode, size=10, seed=1)
    path = tmp_path / f"x{MODE_FILES[mode]}"
    img.save(path)
    rgb = load_image(path)
    assert rgb.mode == "RGB" and rgb.size == (10, 10)
    if mode == "I;16":
        # 16-bit values are rescaled, not clipped at 255
        raw = np.asarray(Image.open(path), dtype=np.float64)
        expected = np.clip(raw / 65535 * 255 + 0.5, 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(np.asarray(rgb)[..., 0], expected)
        assert len(np.unique(np.asarray(rgb))) > 50
    if mode == "L":
        np.testing.assert_array_equal(np.asarray(rgb)[..., 1], np.asarray(Image.open(path)))


def test_to_rgb_palette_with_transparency():
    img = Image.new("P", (4, 4))
    img.putpalette([255, 0, 0] * 256)
    img.info["transparency"] = 0
    assert to_rgb(img).getpixel((0, 0)) == (255, 0, 0)


@pytest.mark.parametrize("side", [9000, 10400, 13000, 13500])  # 0.9x, 1.2x, 1.9x and 2.04x PIL's limit
def test_the_header_check_refuses_only_images_pil_refuses(side, tmp_path):
    """PIL refuses a file over 2x its limit (89,478,485 pixels) in Image.open; between 1x and 2x it only warns,
    and a 108 MP phone photo (12000 x 9000) loads in torchvision and timm: it must not be called unreadable."""
    from tests.data.test_folder import png_header
    from vit.data.io import check_image_file

    assert Image.MAX_IMAGE_PIXELS == 89_478_485
    path = tmp_path / "big.png"
    path.write_bytes(png_header(side, side))  # 57 bytes: a header claiming side x side pixels
    problem = check_image_file(str(path))
    refused_by_pil = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            Image.open(path).close()
    except Image.DecompressionBombError:
        refused_by_pil = True
    assert refused_by_pil == (side == 13500)
    if refused_by_pil:
        assert problem == f"{side * side:,} pixels, over PIL's limit of 178,956,970 (a decompression-bomb guard); " \
                          "downscale it"
    else:
        assert problem is None


def save_turned(path, pixels: np.ndarray, orientation: int, **save) -> None:
    """``pixels`` saved as stored, with an EXIF orientation tag (what a phone writes for a portrait photo: 6)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, exif=exif, **save)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_photo_is_read_as_its_exif_orientation_shows_it(orientation, tmp_path):
    from PIL import ImageOps

    from vit.data.io import exif_orientation, open_image

    pixels = np.random.default_rng(orientation).integers(0, 256, (30, 40, 3), dtype=np.uint8)  # stored 40 x 30
    for name, save in (("photo.jpg", {"quality": 95}), ("photo.png", {})):
        save_turned(tmp_path / name, pixels, orientation, **save)
        with open_image(tmp_path / name) as img:
            assert exif_orientation(img) == orientation and img.size == (40, 30)  # from the header
        expected = ImageOps.exif_transpose(Image.open(tmp_path / name)).convert("RGB")  # Pillow's own turn
        got = load_image(tmp_path / name)
        assert got.size == ((30, 40) if orientation > 4 else (40, 30))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_a_damaged_exif_block_leaves_the_photo_as_stored(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "photo.jpg", exif=b"Exif\x00\x00MM\x00*\x00\x00\xff\xff", quality=95)
    assert load_image(tmp_path / "photo.jpg").size == (40, 30)


def test_reading_the_orientation_decodes_nothing(tmp_path):
    """PIL's getexif() decodes a PNG to look for a late eXIf chunk; a broken one then counted as loaded, and its
    junk pixels went on to the model (caught by `vit serve`'s test of a 195 MP PNG of 4 junk bytes)."""
    from vit.data.io import exif_orientation, open_image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    data = (tmp_path / "a.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2] + data[-12:])  # its IDAT cut short, then IEND
    with open_image(tmp_path / "cut.png") as img:
        assert exif_orientation(img) == 1
    with pytest.raises(OSError, match=r"cannot read image .*cut\.png"):
        load_image(tmp_path / "cut.png")


def test_a_png_of_junk_pixels_is_refused_after_its_orientation_is_read(tmp_path):
    """A valid 64x64 PNG header whose IDAT is 4 junk bytes: reading its orientation must not decode it (PIL's
    getexif() would, swallow the error and count the junk as loaded), so the decode still fails, naming it."""
    import struct
    import zlib

    from vit.data.io import exif_orientation, open_image

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)  # 8-bit RGB
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                                        + chunk(b"IDAT", b"\xde\xad\xbe\xef") + chunk(b"IEND", b""))
    with open_image(tmp_path / "junk.png") as img:
        assert img.size == (64, 64) and exif_orientation(img) == 1
    with pytest.raises(OSError, match=r"cannot read image .*junk\.png"):
        load_image(tmp_path / "junk.png")


def test_a_large_jpeg_decodes_at_the_scale_the_evaluation_resize_needs(tmp_path):
    """`vit predict`, `vit serve` and the val/test splits resize the short side to S before the centre crop: a
    JPEG at least 4S is decoded at 1/2-1/8 scale, still >= 2S, and resizes to within a grey level of the whole
    (with less than a halving left to the resize it is ~1.5-2 levels off: measured)."""
    from sklearn.datasets import load_sample_images
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Resize

    china = Image.fromarray(load_sample_images().images[0]).resize((1600, 1200), Image.Resampling.BICUBIC)
    grain = np.random.default_rng(0).normal(0, 3, (1200, 1600, 3))
    Image.fromarray(np.clip(np.asarray(china) + grain, 0, 255).astype(np.uint8)).save(tmp_path / "a.jpg", quality=90)
    Image.fromarray(np.asarray(china)).save(tmp_path / "a.png")
    whole = load_image(tmp_path / "a.jpg")
    for short_side, size in ((75, (200, 150)), (112, (400, 300)), (224, (800, 600)), (400, (1600, 1200))):
        reduced = load_image(tmp_path / "a.jpg", short_side=short_side)
        assert reduced.size == size  # 1/8, 1/4, 1/2, whole: the short side stays >= 2 short_side
        prepare = Compose([Resize(short_side, InterpolationMode.BICUBIC), CenterCrop(short_side * 7 // 8)])
        diff = np.abs(np.asarray(prepare(reduced)).astype(float) - np.asarray(prepare(whole)))
        assert diff.mean() < 1.0, (short_side, diff.mean())
    assert load_image(tmp_path / "a.png", short_side=112).size == (1600, 1200)  # JPEG's DCT scaling only
