"""The path,caption table reader, its DataModule and the character tokenizer of a CLIP trained from scratch."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vit.data.captions import ALPHABET, CaptionTable, CharCaptions, read_captions
from vit.errors import UserPathError, UserValueError


def table(folder, rows, header="path,caption"):
    """A captions.csv in ``folder`` and a white 4x4 image per row's path."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [header]
    for path, caption in rows:
        Image.new("L", (4, 4), 255).save(folder / path)
        lines.append(f"{path},{caption}")
    (folder / "captions.csv").write_text("\n".join(lines) + "\n")
    return folder / "captions.csv"


def test_rows_are_read_with_paths_relative_to_the_table(tmp_path):
    path = table(tmp_path / "t", [("a.png", "a handwritten 7"), ("b.png", '"the digit, seven"')])
    assert read_captions(path) == [(tmp_path / "t" / "a.png", "a handwritten 7"),
                                   (tmp_path / "t" / "b.png", "the digit, seven")]


@pytest.mark.parametrize(("header", "rows", "said"), [
    ("path,text", [("a.png", "x")], "must name the columns path and caption, found path,text"),
    ("path,caption", [("a.png", " ")], "line 2: an empty caption"),
    ("path,caption", [], "no rows under the header"),
])
def test_a_bad_table_is_named(tmp_path, header, rows, said):
    with pytest.raises(UserValueError, match=said):
        read_captions(table(tmp_path, rows, header))


def test_a_missing_image_names_its_line(tmp_path):
    path = table(tmp_path, [("a.png", "x")])
    path.write_text(path.read_text() + "gone.png,y\n")
    with pytest.raises(UserPathError, match=r"line 3: image not found: .*gone\.png"):
        read_captions(path)
    with pytest.raises(UserPathError, match="caption table not found"):
        read_captions(tmp_path / "none.csv")


def test_char_captions_lay_ids_out_as_clips_tower_reads_them():
    tok = CharCaptions(ALPHABET, context_length=6)
    # <bos>=2, then the alphabet from id 4 ('a' 4, 'b' 5), the end-of-text the highest id, <pad>=0
    eot = 4 + len(ALPHABET)
    assert tok.vocab_size == eot + 1 and tok.eot_id == eot
    expected = torch.tensor([[2, 4, 5, eot, 0, 0], [2, 5, eot, 0, 0, 0]])
    assert torch.equal(tok(["Ab", "b"]), expected)  # lower-cased
    long = tok("abcdefgh")  # cut to 4 characters, the end-of-text kept last
    assert torch.equal(long, torch.tensor([[2, 4, 5, 6, 7, eot]]))
    assert int(long.argmax()) == 5 and int(tok("?")[0, 1]) == 1  # an unknown character is <unk>
    again = CharCaptions.from_dict(tok.to_dict())
    assert torch.equal(again(["Ab", "b"]), expected)


def test_char_captions_need_room_for_a_character():
    CharCaptions(context_length=3)
    with pytest.raises(UserValueError, match="context_length"):
        CharCaptions(context_length=2)


@pytest.mark.parametrize("val", [None, "table"])
def test_the_datamodule_gives_normalised_images_and_their_captions(tmp_path, val):
    rows = [(f"{i}.png", f"caption {i}") for i in range(10)]
    train = table(tmp_path / "train", rows)
    val_path = str(table(tmp_path / "val", rows[:3])) if val else None
    data = CaptionTable(str(train), val_path, val_fraction=0.2, img_size=8, in_chans=1, mean=[0.25], std=[0.5],
                        batch_size=4)
    data.setup("fit")
    assert (len(data.splits["train"]), len(data.splits["val"])) == ((10, 3) if val else (8, 2))
    images, captions = next(iter(data.train_dataloader()))
    assert images.shape == (4, 1, 8, 8) and len(captions) == 4 and all(c.startswith("caption ") for c in captions)
    torch.testing.assert_close(images, torch.full_like(images, (1.0 - 0.25) / 0.5))  # white, normalised
    assert sorted(data.captions("train") + ([] if val else data.captions("val"))) == sorted(c for _, c in rows)


def test_the_datamodule_refuses_a_bad_fraction_or_channel_count():
    with pytest.raises(UserValueError, match="val_fraction"):
        CaptionTable("x.csv", val_fraction=1.0)
    with pytest.raises(UserValueError, match="in_chans"):
        CaptionTable("x.csv", in_chans=2)
