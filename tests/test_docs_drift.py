"""The docs say what the code does (issue 63's first hour): checkpoint names `vit fit` writes, the JSON keys of an
answer, what the model card holds, and the CLIP tokenizer files written offline by the documented command."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.test_readme import PAGES, ROOT, bash_lines

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def test_every_checkpoint_the_docs_name_in_a_run_folder_is_one_vit_fit_writes():
    """`vit fit` writes last.ckpt and best-{epoch}-{step}.ckpt in checkpoints/: export.md's best.ckpt never exists."""
    named = [(page.name, m.group(1)) for page in PAGES
             for m in re.finditer(r"checkpoints/([^\s\"'`/]+)\.ckpt", page.read_text())]
    assert named, "no checkpoint named in the docs: the pattern is wrong"
    assert [(page, name) for page, name in named if name != "last" and not name.startswith("best-")] == []


def test_the_answer_keys_confidence_md_lists_are_those_vit_predict_writes(calibrated, tmp_path):
    """docs/confidence.md's table of the decision names the JSON record's keys beside path, top_k and error: once
    it listed four where the record had five."""
    from tests.helpers import random_images
    from vit.commands import run

    text = (ROOT / "docs" / "confidence.md").read_text()
    row = re.search(r"^\| `vit predict` JSON.*$", text, re.M)
    assert row, "docs/confidence.md has no table row for vit predict's JSON"
    cells = row.group(0).strip("|").split("|")[1:]  # the decision's and the score's columns
    listed = [key for cell in cells for key in re.findall(r"`(\w+)`", cell)]
    ckpt, _ = calibrated
    images = random_images(tmp_path / "images", 2)
    rows = run(["predict", "--ckpt", str(ckpt), *map(str, images), "--out", str(tmp_path / "p.json")])
    plain = {"path", "top_k", "error"}
    assert sorted(listed) == sorted(set(rows[0]) - plain)


def test_export_md_says_the_card_carries_the_calibration_as_a_calibrated_card_does(calibrated, tmp_path):
    from vit.commands import main

    text = (ROOT / "docs" / "export.md").read_text()
    assert "not in it yet" not in text and "states its temperature" in text
    ckpt, _ = calibrated
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "hub")])
    card = (tmp_path / "hub" / "README.md").read_text()
    assert "## Confidence" in card and "temperature T = " in card


def test_the_documented_clip_tokenizer_command_writes_files_that_tokenize_as_open_clip(tmp_path, monkeypatch):
    """open_clip's SimpleTokenizer has no save_pretrained: docs/zeroshot.md's command writes vocab.json and
    merges.txt from the package, offline; vit's tokenizer reads them and gives open_clip's ids."""
    import runpy

    open_clip = pytest.importorskip("open_clip")
    (command,) = [line for line in bash_lines(ROOT / "docs" / "zeroshot.md") if "clip_tokenizer_files.py" in line]
    argv = shlex.split(command)
    assert argv[:2] == ["python", "scripts/dev/clip_tokenizer_files.py"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", [str(ROOT / argv[1]), *argv[2:]])
    runpy.run_path(str(ROOT / argv[1]), run_name="__main__")  # as `python scripts/...` runs it
    out = tmp_path / argv[argv.index("--out") + 1]
    assert sorted(p.name for p in out.iterdir()) == ["merges.txt", "vocab.json"]

    from vit.data.clip_text import load_tokenizer

    ours = load_tokenizer(out, family="clip", context_length=77)
    texts = ["a photo of a maple leaf.", "Oak, MAPLE & birch!", "naïve café 123", ""]
    assert ours(texts).tolist() == open_clip.get_tokenizer("ViT-B-32")(texts).tolist()
    (next_line,) = [line for line in bash_lines(ROOT / "docs" / "zeroshot.md") if "--tokenizer clip_tokenizer" in line]
    assert Path(argv[argv.index("--out") + 1]).name in next_line  # the next command reads what this one wrote
