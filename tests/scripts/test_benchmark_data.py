"""scripts/bench/benchmark_data.py runs end to end (tiny sizes, one run: a smoke test, not a timing)."""

import json

import pytest

from tests import load_script


def test_benchmark_data_times_both_pipelines_and_sizes_the_loader(tmp_path):
    benchmark = load_script("benchmark_data")
    out = tmp_path / "data.json"
    result = benchmark.main(["--per_class", "6", "--img_size", "32", "--batch_size", "4", "--images", "8",
                             "--runs", "1", "--model_img_s", "1000", "--json", str(out)])
    assert json.loads(out.read_text())["ours_img_s"] == result["ours_img_s"] > 0 and result["timm_img_s"] > 0
    assert result["ratio_median"] == pytest.approx(result["ours_img_s"] / result["timm_img_s"])
    assert result["cores_needed"]["ours"] == -(-1000 // result["ours_img_s"])  # ceil
    assert {"decode", "crop+resize+flip", "augment", "to tensor"} <= set(result["stages_ms"]["ours"])
    assert {"decode", "crop+resize", "augment", "normalise", "erase"} <= set(result["stages_ms"]["timm"])
    assert {"decode", "augment"} <= set(result["stages_ms"]["shards"]) & set(result["stages_ms"]["shards_320"])
    bound = result["bound"]  # what pre-resizing can give at most
    # Which of the two bounds is larger is a timing (it flipped under load); their formulas are not.
    assert 0.6 < bound["pixel_ratio"] < 0.8 and bound["decode_by_pixels"] > 1
    assert bound["decode_free"] == pytest.approx(bound["folder_ms"] / bound["resized_rest_ms"])


def test_benchmark_data_writes_imagenet_sized_jpegs_from_real_photos(tmp_path):
    from PIL import Image

    root = load_script("benchmark_data").write_jpegs(tmp_path, classes=2, per_class=3)
    files = sorted((root / "train").rglob("*.jpg"))
    assert len(files) == 6 and len(list((root / "val").rglob("*.jpg"))) == 2
    with Image.open(files[0]) as img:
        assert img.size == (500, 375) and img.format == "JPEG"
