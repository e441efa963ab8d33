"""`vit attention`: a figure and the top classes per image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import TINY_DIM, random_images


def write_checkpoint(path, *, model_name="vit_digits_patch2_8", **kwargs) -> None:
    """A checkpoint in the format `vit fit` writes, from an untrained ImageClassifier."""
    from vit.tasks.classify import ImageClassifier

    torch.manual_seed(0)
    classifier = ImageClassifier(model=model_name, **kwargs)
    checkpoint = {"state_dict": classifier.state_dict()}
    classifier.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)


@pytest.fixture
def digits_checkpoint(tmp_path):
    path = tmp_path / "digits.ckpt"
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    write_checkpoint(
        path, num_classes=10, class_names=names, mean=(0.5,), std=(0.5,),
        model_kwargs=dict(embed_dim=TINY_DIM, depth=2, num_heads=4),
    )
    return path


def test_vit_attention_writes_a_png_per_image(tmp_path, digits_checkpoint, capsys):
    from vit.commands import main

    rgb = tmp_path / "photo.jpg"
    Image.fromarray((np.random.default_rng(0).random((30, 20, 3)) * 255).astype(np.uint8)).save(rgb)
    gray = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(1).random((8, 8)) * 255).astype(np.uint8)).save(gray)
    out = tmp_path / "maps"
    main([
        "attention", "--ckpt", str(digits_checkpoint), str(rgb), str(gray), "--out", str(out), "--top_k", "3",
    ])

    for name in ("photo", "digit"):
        with Image.open(out / f"{name}.png") as png:
            assert png.format == "PNG" and png.width > 200
    results = json.loads((out / "predictions.json").read_text())
    assert [r["path"] for r in results] == [str(rgb), str(gray)]
    assert [r["error"] for r in results] == [None, None]
    for r in results:
        assert len(r["top_k"]) == 3
        probs = [p["probability"] for p in r["top_k"]]
        assert probs == sorted(probs, reverse=True)
        assert all(p["name"] == ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                                 "nine"][p["class"]] for p in r["top_k"])
    printed = capsys.readouterr().out
    assert results[0]["top_k"][0]["name"] in printed and "photo.png" in printed

    # The same classes and probabilities as `vit predict`, which prepares images the same way.
    from vit.deploy import load_classifier
    from vit.deploy.predict import predict_files

    predicted = predict_files(load_classifier(digits_checkpoint), [rgb, gray], top_k=3)
    for ours, theirs in zip(results, predicted):
        assert [p["class"] for p in ours["top_k"]] == [p["class"] for p in theirs["top_k"]]
        np.testing.assert_allclose([p["probability"] for p in ours["top_k"]],
                                   [p["probability"] for p in theirs["top_k"]], atol=1e-5)


def test_vit_attention_choices_and_native_size(tmp_path, digits_checkpoint):
    from vit.commands.attention import main

    folder = tmp_path / "images"
    folder.mkdir()
    image = folder / "wide.png"
    Image.fromarray((np.random.default_rng(0).random((10, 17)) * 255).astype(np.uint8)).save(image)
    (tmp_path / "other").mkdir()  # another file of the same name: its map must not overwrite the first's
    same_name = tmp_path / "other" / "wide.png"
    Image.fromarray((np.random.default_rng(1).random((10, 17)) * 255).astype(np.uint8)).save(same_name)
    main([
        "--ckpt", str(digits_checkpoint), str(image), str(same_name), str(image), "--out", str(tmp_path / "a"),
        "--layer", "-1", "--head", "0", "2", "--rollout", "grad", "--target_class", "seven", "--native_size",
    ])
    assert (tmp_path / "a" / "wide.png").is_file() and (tmp_path / "a" / "wide_2.png").is_file()
    assert not (tmp_path / "a" / "wide_3.png").exists()  # the file named twice is drawn once
    # A folder is searched for images; underscores work as in `vit predict`.
    results = main(["--ckpt", str(digits_checkpoint), str(folder), "--out", str(tmp_path / "b"), "--head",
                    "mean", "--rollout", "none", "--top_k", "2"])
    assert [r["png"] for r in results] == [str(tmp_path / "b" / "wide.png")]
    assert len(results[0]["top_k"]) == 2


def test_vit_attention_on_an_rgb_model_takes_grayscale_and_native_sizes(tmp_path):
    from vit.commands.attention import main

    ckpt = tmp_path / "rgb.ckpt"
    write_checkpoint(
        ckpt, model_name="vit_cifar_patch4_32", num_classes=3, class_names=["cat", "dog", "fox"],
        model_kwargs=dict(embed_dim=TINY_DIM, depth=1, num_heads=4),
    )
    gray = tmp_path / "gray.png"
    Image.fromarray((np.random.default_rng(0).random((50, 70)) * 255).astype(np.uint8)).save(gray)
    results = main(["--ckpt", str(ckpt), str(gray), "--out", str(tmp_path / "out"), "--native_size"])
    assert {p["name"] for p in results[0]["top_k"]} == {"cat", "dog", "fox"}
    with Image.open(results[0]["png"]) as png:
        assert png.mode in ("RGB", "RGBA")


def test_output_names_never_collide():
    from vit.commands.attention import _output_names

    paths = [Path("a/x.png"), Path("b/x.png"), Path("x_2.png"), Path("c/x.jpg")]
    assert _output_names(paths) == ["x", "x_2", "x_2_2", "x_3"]


def test_vit_attention_reports_bad_inputs(tmp_path, digits_checkpoint):
    from vit.commands.attention import main

    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    with pytest.raises(OSError, match=r"^none of the 1 image file could be read$"):
        main(["--ckpt", str(digits_checkpoint), str(broken), "--out", str(tmp_path / "maps")])
    assert json.loads((tmp_path / "maps" / "predictions.json").read_text())[0]["error"]
    with pytest.raises(FileNotFoundError, match=r"no such image file or folder: .*missing\.png"):
        main(["--ckpt", str(digits_checkpoint), str(tmp_path / "missing.png"), "--out", str(tmp_path)])
    image = tmp_path / "ok.png"
    Image.new("L", (8, 8)).save(image)
    with pytest.raises(OSError) as stopped:  # --strict: a bad file stops the run before predictions.json
        main(["--ckpt", str(digits_checkpoint), str(image), str(broken), "--out", str(tmp_path / "strict"),
              "--strict"])
    assert str(stopped.value) == f"cannot read {broken}: not an image in a format PIL reads"
    assert not (tmp_path / "strict" / "predictions.json").exists()
    with pytest.raises(ValueError, match="--head 7: the model has 4 heads"):
        main(["--ckpt", str(digits_checkpoint), str(image), "--out", str(tmp_path), "--head", "7"])
    with pytest.raises(ValueError, match="--target_class 'cat'"):
        main(["--ckpt", str(digits_checkpoint), str(image), "--out", str(tmp_path), "--rollout", "grad",
              "--target_class", "cat"])
    with pytest.raises(ValueError, match=r"layer 5 does not exist: the model has 2 layers"):
        main(["--ckpt", str(digits_checkpoint), str(image), "--out", str(tmp_path), "--layer", "5"])


def test_vit_attention_over_a_folder_skips_unreadable_files_and_writes_predicts_records(
    tmp_path, digits_checkpoint, capsys,
):
    from vit.commands import run

    folder = tmp_path / "images"
    random_images(folder, 3, name="d{i}.png")
    (folder / "a_random.jpg").write_bytes(np.random.default_rng(0).bytes(3000))
    good = (folder / "d0.png").read_bytes()
    (folder / "b_cut.png").write_bytes(good[: len(good) // 2])
    (folder / "notes.txt").write_text("not an image")

    out = tmp_path / "maps"
    results = run(["attention", "--ckpt", str(digits_checkpoint), str(folder), "--out", str(out), "--top_k", "3",
                   "--rollout", "none", "--layer", "-1"])
    assert json.loads((out / "predictions.json").read_text()) == results
    assert [Path(r["path"]).name for r in results] == ["a_random.jpg", "b_cut.png", "d0.png", "d1.png", "d2.png"]
    assert [r["png"] for r in results] == [None, None, *(str(out / f"d{i}.png") for i in range(3))]
    assert results[0]["error"] == "not an image in a format PIL reads" and "truncated" in results[1]["error"]
    assert sorted(p.name for p in out.glob("*.png")) == ["d0.png", "d1.png", "d2.png"]
    printed = capsys.readouterr().out
    assert f"skipped 1 non-image file in {folder} (e.g. notes.txt)" in printed
    assert "wrote 3 figure(s) and" in printed and "2 files could not be read" in printed
    assert f"  {folder / 'a_random.jpg'}: not an image in a format PIL reads" in printed

    # One layout for both commands: `vit predict`'s records, plus the figure.
    predicted = run(["predict", "--ckpt", str(digits_checkpoint), str(folder), "--top_k", "3",
                     "--out", str(tmp_path / "p.json")])
    assert json.loads((tmp_path / "p.json").read_text()) == predicted
    for ours, theirs in zip(results, predicted):
        assert set(ours) - {"answer"} == set(theirs) - {"answer"} | {"png"}
        assert set(theirs) - {"answer"} == {"path", "top_k", "error"}
        assert [ours["path"], ours["error"], ours.get("answer")] == [theirs["path"], theirs["error"],
                                                                      theirs.get("answer")]
        assert [p["class"] for p in ours["top_k"]] == [p["class"] for p in theirs["top_k"]]
        assert [p["name"] for p in ours["top_k"]] == [p["name"] for p in theirs["top_k"]]
        np.testing.assert_allclose([p["probability"] for p in ours["top_k"]],
                                   [p["probability"] for p in theirs["top_k"]], atol=1e-5)


def test_help_shows_the_three_modes_and_their_options(capsys):
    """`--text` and `--faithfulness` were hidden: `vit attention` sniffed argv for them, and neither `vit --help`
    nor `vit attention --help` named them."""
    from vit.commands import main

    with pytest.raises(SystemExit) as done:
        main(["attention", "--help"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: vit attention --ckpt CKPT IMAGE [IMAGE ...]")
    for usage in ("vit attention --ckpt CKPT --text SENTENCE [SENTENCE ...]", "vit attention --ckpt CKPT "
                  "--faithfulness IMAGE [IMAGE ...]"):
        assert usage in printed
    for section in ("modes (one at most", "attention maps (the default mode):", "--text: a translation checkpoint's",
                    "--faithfulness: the checks of the maps:"):
        assert section in printed
    for option in ("--text SENTENCE", "--faithfulness", "--rollout", "--native_size", "--target SENTENCE",
                   "--beam_size", "--heads", "--max_images"):
        assert f"  {option}" in printed, option
    main(["--help"])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  attention"))
    assert "--text" in line and "--faithfulness" in line


@pytest.mark.parametrize("argv, mode", [
    (["--ckpt", "m.ckpt", "a.png", "photos"], "maps"),
    (["--ckpt", "t.ckpt", "--text", "1 2 3", "4 5"], "text"),  # the old spellings, options anywhere
    (["--text", "1 2 3", "--ckpt", "t.ckpt"], "text"),
    (["--text=1 2 3", "--ckpt", "t.ckpt", "--heads", "cross", "--layer", "0", "--head", "1"], "text"),
    (["--faithfulness", "--ckpt", "m.ckpt", "photos"], "faithfulness"),
    (["--ckpt", "m.ckpt", "photos", "--faithfulness", "--max_images", "3"], "faithfulness"),
])
def test_the_old_spellings_choose_the_mode(argv, mode, tmp_path):
    from vit.commands.attention import parse_args

    args = parse_args([*argv, "--out", str(tmp_path / "out")])
    assert args.mode == mode
    if mode == "text":
        assert args.images == [] and args.text[0] == "1 2 3"
        assert (args.layer, args.head) in ((-1, "mean"), (0, 1))  # one layer and one head: the alignment's
    else:
        assert args.images and args.text is None


@pytest.mark.parametrize("argv, said", [
    (["--text", "1 2", "--faithfulness"], "not allowed with argument"),
    (["--text", "1 2", "--rollout", "grad"], "--rollout does not apply to --text"),
    (["--text", "1 2", "--layer", "0", "1"], "--text draws one decoder layer's alignment"),
    (["--text", "1 2", "--head", "x"], "--head takes a head number or 'mean', got 'x'"),
    (["photo.png", "--text", "1 2"], "not on image files (photo.png)"),
    (["photo.png", "--max_images", "3"], "--max_images does not apply to the attention maps of images"),
    (["photo.png", "--faithfulness", "--head", "0"], "--head does not apply to --faithfulness"),
    (["--faithfulness"], "--faithfulness checks the maps on images: give image files or folders"),
    ([], "give image files or folders to draw the attention maps of"),
])
def test_an_option_of_another_mode_is_refused_by_name(argv, said, capsys):
    from vit.commands.attention import parse_args

    with pytest.raises(SystemExit) as done:
        parse_args(["--ckpt", "m.ckpt", *argv])
    assert done.value.code == 2 and said in capsys.readouterr().err


def test_every_file_of_the_maps_is_written_atomically(tmp_path, digits_checkpoint, monkeypatch):
    """A kill while a figure or predictions.json is written leaves the old file or the new one, never half."""
    import vit.commands.attention as attention
    from vit.files import save_atomic

    written = []
    monkeypatch.setattr(attention, "save_atomic", lambda write, path: written.append(path) or save_atomic(write, path))
    image = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(1).random((8, 8)) * 255).astype(np.uint8)).save(image)
    out = tmp_path / "maps"
    attention.main(["--ckpt", str(digits_checkpoint), str(image), "--out", str(out), "--rollout", "none"])
    assert sorted(written) == sorted(out.iterdir()) == [out / "digit.png", out / "predictions.json"]
