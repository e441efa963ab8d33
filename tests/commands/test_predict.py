"""`vit predict --ckpt`: top-k CSV/JSON, the same inputs as testing."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.commands.test_attention import write_checkpoint
from tests.helpers import TINY_DIM
from vit.commands import main, run
from vit.deploy import load_classifier


def probabilities(row: dict) -> list[float]:
    """The probabilities of a record, most likely first."""
    return [entry["probability"] for entry in row["top_k"]]


def by_name(row: dict) -> dict[str, float]:
    """A record's probabilities by class name."""
    return {entry["name"]: entry["probability"] for entry in row["top_k"]}


def test_predict_writes_topk_csv_and_json(fitted, tmp_path, capsys):
    from sklearn.datasets import load_digits

    folder = tmp_path / "images"
    folder.mkdir()
    digits = load_digits()
    for i in range(5):
        pixels = np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"digit{i}.png")
    (folder / "readme.txt").write_text("not an image")
    rgb = folder / "colour.jpg"
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(rgb)  # other size and mode: resized, grey

    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    out_csv = tmp_path / "preds.csv"
    main(["predict", "--ckpt", best, str(folder), "--out", str(out_csv), "--top_k", "3"])
    printed = capsys.readouterr().out
    assert f"skipped 1 non-image file in {folder} (e.g. readme.txt)" in printed
    assert f"wrote 6 predictions to {out_csv}\n" in printed  # and nothing about unreadable files
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 6
    assert list(rows[0]) == ["path", "class_1", "prob_1", "class_2", "prob_2", "class_3", "prob_3", "answer", "error"]
    assert all(row["error"] == "" and row["answer"] == row["class_1"] for row in rows)  # no unknown score
    for row in rows:
        probs = [float(row[f"prob_{k}"]) for k in (1, 2, 3)]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert {row[f"class_{k}"] for k in (1, 2, 3)} <= {str(d) for d in range(10)}

    out_json = tmp_path / "preds.json"
    main(["predict", "--ckpt", best, str(folder / "digit0.png"), str(rgb), "--out", str(out_json),
          "--top_k", "10"])
    preds = json.loads(out_json.read_text())
    assert [Path(p["path"]).name for p in preds] == ["digit0.png", "colour.jpg"]
    assert [p["error"] for p in preds] == [None, None]
    assert sum(probabilities(preds[0])) == pytest.approx(1.0, abs=1e-4)
    # the probabilities of a forward pass by hand: the image as the checkpoint's transform prepares it
    classifier = load_classifier(best)
    image = classifier.eval_transform()(Image.open(folder / "digit0.png").convert("L"))
    with torch.no_grad():
        expected = classifier(image[None]).softmax(-1)[0]
    order = expected.argsort(descending=True).tolist()
    assert [e["class"] for e in preds[0]["top_k"]] == order
    assert [e["name"] for e in preds[0]["top_k"]] == [str(i) for i in order]
    np.testing.assert_allclose(probabilities(preds[0]), expected[order].numpy(), atol=1e-6)
    assert rows[[Path(r["path"]).name for r in rows].index("digit0.png")]["class_1"] == preds[0]["top_k"][0]["name"]

    with pytest.raises(FileNotFoundError, match="no such image file or folder"):
        run(["predict", "--ckpt", best, str(tmp_path / "missing.png")])


def digit_folder(folder: Path, n: int = 8) -> Path:
    """``n`` sklearn digits as 8x8 grayscale PNGs."""
    from sklearn.datasets import load_digits

    folder.mkdir()
    for i, image in enumerate(load_digits().images[:n]):
        Image.fromarray(np.clip(image * 16, 0, 255).astype(np.uint8)).save(folder / f"digit{i}.png")
    return folder


def test_predict_with_the_onnx_export_gives_the_checkpoints_predictions(exported, tmp_path):
    folder = digit_folder(tmp_path / "images")
    args = [str(folder), "--top_k", "10", "--out"]
    from_ckpt = run(["predict", "--ckpt", str(exported.ckpt), *args, str(tmp_path / "a.json")])
    from_onnx = run(["predict", "--ckpt", str(exported.onnx), *args, str(tmp_path / "b.json")])
    assert json.loads((tmp_path / "b.json").read_text()) == from_onnx and len(from_onnx) == 8
    for a, b in zip(from_ckpt, from_onnx):
        assert a["path"] == b["path"] and a["top_k"][0]["name"] == b["top_k"][0]["name"]
        assert by_name(a) == pytest.approx(by_name(b), abs=1e-5)
    from_int8 = run(["predict", "--ckpt", str(exported.onnx_int8), *args, str(tmp_path / "c.csv")])
    for a, c in zip(from_ckpt, from_int8):
        assert by_name(c) == pytest.approx(by_name(a), abs=0.01)  # the same classes, probabilities close


def test_the_console_script_exits_0_with_an_onnx_model(exported, tmp_path, monkeypatch):
    """`vit` is ``sys.exit(main())``: run from the command line, main returns None (exit status 0), since
    ``sys.exit(rows)`` would print the rows and exit with status 1."""
    import sys

    folder = digit_folder(tmp_path / "images", n=2)
    monkeypatch.setattr(sys, "argv", ["vit", "predict", "--ckpt", str(exported.onnx), str(folder),
                                      "--out", str(tmp_path / "p.csv")])
    assert main() is None
    assert len(list(csv.DictReader((tmp_path / "p.csv").open()))) == 2


def test_predict_bf16_runs_autocast_and_warns_where_the_cpu_emulates_it(exported, tmp_path, monkeypatch):
    import warnings

    import vit.deploy.inference

    folder = digit_folder(tmp_path / "images")
    args = ["predict", "--ckpt", str(exported.ckpt), str(folder), "--top_k", "10", "--out", str(tmp_path / "p.json")]
    fp32 = run(args)
    monkeypatch.setattr(vit.deploy.inference, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="no native bf16.*slower than fp32"):
        bf16 = run([*args, "--precision", "bf16"])
    for a, b in zip(fp32, bf16):
        assert by_name(a) == pytest.approx(by_name(b), abs=0.01)
    monkeypatch.setattr(vit.deploy.inference, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no emulation warning (the deprecation is tests/deploy/test_backends.py's)
        warnings.filterwarnings("ignore", "--precision bf16 is deprecated", FutureWarning)
        main([*args, "--precision", "bf16"])
    with pytest.raises(ValueError, match=r"model.onnx: precision 'bf16' is for checkpoints"):
        run(["predict", "--ckpt", str(exported.onnx), str(folder), "--precision", "bf16"])
    with pytest.raises(ValueError, match=r"model.onnx: compile applies to checkpoints"):
        run(["predict", "--ckpt", str(exported.onnx), str(folder), "--compile"])


def test_predict_names_a_bad_onnx_file(exported, tmp_path):
    import onnx

    folder = digit_folder(tmp_path / "images", n=1)
    proto = onnx.load(exported.onnx)
    del proto.metadata_props[:]
    onnx.save(proto, tmp_path / "bare.onnx")
    with pytest.raises(ValueError, match=r"bare.onnx: the ONNX metadata lacks model_name, class_names.*vit export"):
        run(["predict", "--ckpt", str(tmp_path / "bare.onnx"), str(folder)])
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"junk\.onnx: not a readable ONNX model"):
        run(["predict", "--ckpt", str(tmp_path / "junk.onnx"), str(folder)])
    with pytest.raises(FileNotFoundError, match=r"ONNX model not found: .*missing\.onnx"):
        run(["predict", "--ckpt", str(tmp_path / "missing.onnx"), str(folder)])


@pytest.mark.slow
def test_predict_compile_gives_the_eager_probabilities(fitted, tmp_path):
    folder = digit_folder(tmp_path / "images")
    best = str(next((fitted / "ckpt").glob("best-*.ckpt")))
    args = ["predict", "--ckpt", best, str(folder), "--top_k", "10", "--out", str(tmp_path / "p.json")]
    eager, compiled = run(args), run([*args, "--compile"])
    for a, b in zip(eager, compiled):
        assert by_name(a) == pytest.approx(by_name(b), abs=1e-5)


def test_predict_matches_pixels_normalised_by_hand(tmp_path):
    """The expected probabilities come from numpy, not from the transform under test: an RGB image already at the
    resize size (32 / crop_pct = 36), centre-cropped and normalised with the checkpoint's own mean and std by hand.
    A wrong mean or std, a swapped channel order or an off-centre crop in prediction changes them."""
    ckpt = tmp_path / "rgb.ckpt"
    mean, std = np.array([0.2, 0.5, 0.7]), np.array([0.3, 0.2, 0.25])  # unlike any default, unlike each other
    write_checkpoint(ckpt, model_name="vit_cifar_patch4_32", num_classes=3, class_names=["cat", "dog", "fox"],
                     mean=tuple(mean), std=tuple(std), crop_pct=0.875, interpolation="bilinear",
                     model_kwargs=dict(embed_dim=TINY_DIM, depth=1, num_heads=4))
    pixels = np.random.default_rng(0).integers(0, 256, (36, 36, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "photo.png")

    rows = run(["predict", "--ckpt", str(ckpt), str(tmp_path / "photo.png"), "--top_k", "3",
                "--out", str(tmp_path / "p.json")])

    model = load_classifier(ckpt).model

    def forward(mean: np.ndarray, std: np.ndarray) -> dict[str, float]:
        x = (pixels[2:34, 2:34] / 255.0 - mean) / std  # the centre 32x32, (H, W, C)
        with torch.no_grad():
            probs = model(torch.tensor(x.transpose(2, 0, 1), dtype=torch.float32)[None]).softmax(-1)[0]
        return dict(zip(["cat", "dog", "fox"], probs.tolist()))

    expected = forward(mean, std)
    assert by_name(rows[0]) == pytest.approx(expected, abs=2e-6)
    # the test can tell: the ImageNet mean and std, or the two swapped, move the probabilities far past its tolerance
    for wrong in (forward(np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])), forward(std, mean)):
        assert max(abs(wrong[k] - expected[k]) for k in expected) > 1e-3


@pytest.fixture
def digits_ckpt(tmp_path) -> Path:
    """An untrained digits checkpoint (1 channel, 8x8): enough to test the plumbing, no training needed."""
    path = tmp_path / "digits.ckpt"
    write_checkpoint(path, num_classes=10, class_names=[str(d) for d in range(10)], mean=(0.3,), std=(0.4,),
                     model_kwargs=dict(embed_dim=TINY_DIM, depth=2, num_heads=4))
    return path


def with_bad_files(folder: Path) -> list[Path]:
    """Add to ``folder`` random bytes named .jpg and a PNG cut in half (first in sorted order) and a text file."""
    bad = [folder / "a_random_bytes.jpg", folder / "b_cut_short.png"]
    bad[0].write_bytes(np.random.default_rng(0).bytes(3000))
    good = (folder / "digit0.png").read_bytes()
    bad[1].write_bytes(good[: len(good) // 2])
    (folder / "notes.txt").write_text("not an image")
    return bad


def test_predict_reports_unreadable_files_and_writes_every_other_row(digits_ckpt, tmp_path, capsys):
    folder = digit_folder(tmp_path / "images", n=12)
    bad = with_bad_files(folder)
    out = tmp_path / "p.csv"
    # batches of 2: the first holds only the two bad files
    rows = run(["predict", "--ckpt", str(digits_ckpt), str(folder), "--out", str(out), "--batch_size", "2"])

    assert len(rows) == 14 and [r["path"] for r in rows[:2]] == list(map(str, bad))
    assert rows[0]["error"] == "not an image in a format PIL reads" and rows[0]["top_k"] == []
    assert "truncated" in rows[1]["error"] and rows[1]["top_k"] == []
    assert all(r["error"] is None and len(r["top_k"]) == 5 for r in rows[2:])
    printed = capsys.readouterr().out
    assert f"skipped 1 non-image file in {folder} (e.g. notes.txt)" in printed
    assert f"wrote 12 predictions to {out}; 2 files could not be read (the reason is in the error column" in printed
    assert f"  {bad[0]}: not an image in a format PIL reads\n  {bad[1]}: image file is truncated" in printed

    table = list(csv.DictReader(out.open()))
    assert [r["path"] for r in table] == [r["path"] for r in rows]
    assert [r["error"] for r in table[:2]] == [rows[0]["error"], rows[1]["error"]]
    assert all(r[f"{col}_{k}"] == "" for r in table[:2] for col in ("class", "prob") for k in range(1, 6))
    assert all(r["error"] == "" and r["class_1"] == row["top_k"][0]["name"] for r, row in zip(table[2:], rows[2:]))

    # the same records from worker processes: the Unreadable markers cross the process boundary
    from vit.deploy.predict import predict_files

    assert predict_files(load_classifier(digits_ckpt), [Path(r["path"]) for r in rows], num_workers=2) == rows


def test_predict_lists_at_most_ten_unreadable_files(digits_ckpt, tmp_path, capsys):
    folder = digit_folder(tmp_path / "images", n=1)
    for i in range(13):
        (folder / f"junk{i:02d}.jpg").write_bytes(b"")
    rows = run(["predict", "--ckpt", str(digits_ckpt), str(folder), "--out", str(tmp_path / "p.json")])
    printed = capsys.readouterr().out
    assert "wrote 1 predictions" in printed and "13 files could not be read" in printed
    assert printed.count(": empty file (0 bytes)") == 10 and "  ... and 3 more" in printed
    assert json.loads((tmp_path / "p.json").read_text()) == rows


def test_predict_strict_stops_at_the_first_unreadable_file(digits_ckpt, tmp_path, capsys):
    from vit.deploy.image_files import UnreadableImageError

    folder = digit_folder(tmp_path / "images", n=3)
    bad = with_bad_files(folder)
    out = tmp_path / "p.csv"
    args = ["predict", "--ckpt", str(digits_ckpt), str(folder), "--out", str(out), "--strict"]
    with pytest.raises(UnreadableImageError) as stopped:
        run(args)
    assert str(stopped.value) == f"cannot read {bad[0]}: not an image in a format PIL reads"
    assert isinstance(stopped.value, OSError) and not out.exists()
    # the console script: exit status 1 and the message, without a traceback
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "Traceback" not in err
    assert err.startswith(f"vit predict: error: cannot read {bad[0]}: not an image in a format PIL reads\n")


def test_predict_exits_non_zero_when_no_file_can_be_read(digits_ckpt, tmp_path, capsys):
    folder = digit_folder(tmp_path / "images", n=1)
    bad = with_bad_files(folder)
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as exited:
        main(["predict", "--ckpt", str(digits_ckpt), *map(str, bad), "--out", str(out)])
    assert exited.value.code == 1
    printed = capsys.readouterr()
    assert printed.err.startswith("vit predict: error: none of the 2 image files could be read\n")
    assert f"  {bad[1]}: image file is truncated" in printed.out
    assert [r["error"] is not None for r in json.loads(out.read_text())] == [True, True]  # the reasons are kept


def test_predict_with_an_onnx_model_reports_unreadable_files_the_same_way(exported, tmp_path, capsys):
    folder = digit_folder(tmp_path / "images", n=4)
    bad = with_bad_files(folder)
    from_ckpt = run(["predict", "--ckpt", str(exported.ckpt), str(folder), "--out", str(tmp_path / "a.csv")])
    from_onnx = run(["predict", "--ckpt", str(exported.onnx), str(folder), "--out", str(tmp_path / "b.csv")])
    assert "wrote 4 predictions" in capsys.readouterr().out
    assert [(r["path"], r["error"]) for r in from_onnx] == [(r["path"], r["error"]) for r in from_ckpt]
    assert [r["path"] for r in from_onnx if r["error"]] == list(map(str, bad))
    for a, b in zip(from_ckpt[2:], from_onnx[2:]):
        assert by_name(b) == pytest.approx(by_name(a), abs=1e-5)
    with pytest.raises(OSError, match=r"^cannot read .*a_random_bytes\.jpg: not an image"):
        run(["predict", "--ckpt", str(exported.onnx), str(folder), "--strict"])


def test_a_file_named_twice_gets_one_row(digits_ckpt, tmp_path, monkeypatch):
    folder = digit_folder(tmp_path / "images", n=3)
    monkeypatch.chdir(tmp_path)
    # the folder, one of its files again (relative, with ./), and the folder once more
    rows = run(["predict", "--ckpt", str(digits_ckpt), "images", "./images/digit1.png", str(folder),
                "--out", str(tmp_path / "p.csv")])
    assert [r["path"] for r in rows] == [f"images/digit{i}.png" for i in range(3)]


def test_an_archive_or_a_heic_photo_named_to_predict_gets_its_reason(digits_ckpt, tmp_path, without_pillow_heif):
    """`vit predict photos.zip IMG_1.HEIC a.png`: both rows said "not an image in a format PIL reads"; they now say
    what each is and what to do."""
    import shutil

    folder = digit_folder(tmp_path / "images", n=2)
    archive = shutil.make_archive(str(tmp_path / "photos"), "zip", folder)
    heic = tmp_path / "IMG_0001.HEIC"
    heic.write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(64))
    rows = run(["predict", "--ckpt", str(digits_ckpt), archive, str(heic), str(folder / "digit0.png"),
                "--out", str(tmp_path / "p.csv")])
    assert rows[0]["error"] == "an archive, not an image: extract it and give the images in it"
    assert rows[1]["error"].startswith("PIL does not read .heic photos (iPhones' HEIC, cameras' RAW): convert them")
    assert rows[2]["error"] is None and len(rows[2]["top_k"]) == 5


def test_predict_reports_an_image_the_resize_would_blow_up_and_writes_every_other_row(digits_ckpt, tmp_path):
    """A 3-kB PNG of 2,000,000 x 1 pixels: the 8x8 model's resize (short side to 8) would make it 16,000,000 x 8,
    and a 224 model's 248,000,000 x 248, whose MemoryError ended the whole run."""
    folder = digit_folder(tmp_path / "images", n=3)
    Image.new("L", (2_000_000, 1)).save(folder / "b_panorama.png")
    Image.new("L", (2_000, 1)).save(folder / "c_strip.png")  # 16,000 x 8 when resized: fine
    rows = run(["predict", "--ckpt", str(digits_ckpt), str(folder), "--out", str(tmp_path / "p.csv")])
    errors = {Path(r["path"]).name: r["error"] for r in rows}
    assert errors["b_panorama.png"] == ("2000000x1: scaling its short side to the model's 8 pixels would make it "
                                        "128,000,000 pixels, over the limit of 40,000,000; crop it to a less "
                                        "elongated shape")
    assert len(rows) == 5 and sum(e is None for e in errors.values()) == 4  # the strip and the digits


def test_with_pillow_heif_a_heic_photo_gets_its_prediction(digits_ckpt, tmp_path):
    folder = digit_folder(tmp_path / "images", n=2)
    Image.open(folder / "digit0.png").save(tmp_path / "IMG_0001.HEIC", "HEIF", quality=95)
    rows = run(["predict", "--ckpt", str(digits_ckpt), str(tmp_path / "IMG_0001.HEIC"), str(folder / "digit0.png"),
                "--out", str(tmp_path / "p.csv")])
    assert [r["error"] for r in rows] == [None, None] and len(rows[0]["top_k"]) == 5


def test_predict_serve_and_the_evaluation_splits_decode_a_large_jpeg_at_the_resize_scale(digits_ckpt, tmp_path,
                                                                                         monkeypatch):
    """The 8x8 digits model resizes the short side to 8: an 800x600 JPEG decodes at 1/8 (100x75) wherever the
    evaluation transform follows, so `vit predict`, `vit serve`, `vit attention` and `vit test` see one image."""
    from vit.data import ImageFolder, io
    from vit.serve.core import Predictor

    sizes, decode = [], io.decode
    monkeypatch.setattr(io, "decode", lambda img, mode="RGB": sizes.append(img.size) or decode(img, mode))
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (600, 800, 3), dtype=np.uint8))
    for c in "ab":
        (tmp_path / "photos" / c).mkdir(parents=True)
        for i in range(4):
            photo.save(tmp_path / "photos" / c / f"{i}.jpg")
    big = tmp_path / "photos" / "a" / "0.jpg"
    run(["predict", "--ckpt", str(digits_ckpt), str(big), "--out", str(tmp_path / "p.csv")])
    assert sizes == [(100, 75)]
    run(["attention", "--ckpt", str(digits_ckpt), str(big), "--out", str(tmp_path / "maps")])
    assert sizes[-1] == (100, 75)
    Predictor(load_classifier(digits_ckpt)).prepare(big.read_bytes(), 10**7)
    assert sizes[-1] == (100, 75)
    dm = ImageFolder(str(tmp_path / "photos"), num_workers=0, img_size=8, crop_pct=1.0, val_fraction=0.25,
                     test_fraction=0.25)
    dm.setup("fit")
    _ = dm.val_set[0], dm.test_set[0], dm.eval_split("train")[0]  # each decoded through its split
    assert sizes[-3:] == [(100, 75)] * 3


@pytest.mark.parametrize(("top_k", "accepted"), [(1, True), (0, False)])
def test_predict_asks_for_one_class_at_least(top_k, accepted):
    from vit.commands.predict import parse_args

    argv = ["--ckpt", "m.ckpt", "a.png", "--top_k", str(top_k)]
    if accepted:
        args = parse_args(argv)
        assert args.top_k == 1 and args.inputs == ["a.png"] and args.out == "predictions.csv"
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)
