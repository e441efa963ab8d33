"""The path,caption table reader, its DataModule and the character tokenizer of a CLIP trained from scratch."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vit.data.captions import ALPHABET, CaptionTable, CharCaptions, read_captions
from vit.errors import UserPathError, UserValueError


def table(folder, rows, header="path,caption", grey=None):
    """A captions.csv in ``folder`` and a 4x4 image per row's path, white or ``grey(path)``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [header]
    for path, caption in rows:
        Image.new("L", (4, 4), 255 if grey is None else grey(path)).save(folder / path)
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


# Several captions per image: image i (grey level 10 * i) has captions "i a", "i b", "i c"; image 9 has one.
MANY = [(f"{i}.png", f"{i} {x}") for i in range(9) for x in "abc"] + [("9.png", "9 only")]


def many_captions(tmp_path, seed=0, val=True, batch_size=5, num_workers=0):
    train = table(tmp_path / "train", MANY, grey=lambda path: 10 * int(path[0]))
    data = CaptionTable(str(train), str(train) if val else None, val_fraction=0.3, img_size=4, in_chans=1,
                        mean=[0.0], std=[1.0], batch_size=batch_size, num_workers=num_workers, seed=seed)
    data.setup("fit")
    return data


def epoch_draws(data, epoch, loader=None):
    """{image: caption} of one training epoch, each caption checked against its image's grey level."""
    loader = loader or data.train_dataloader()
    loader.sampler.set_epoch(epoch)  # as Lightning does at every epoch start
    seen = {}
    for images, captions in loader:
        for image, caption in zip(images, captions, strict=True):
            image_id = int(caption.split()[0])
            assert round(float(image[0, 0, 0]) * 255) == 10 * image_id  # the caption belongs to this image
            assert image_id not in seen  # each image once an epoch
            seen[image_id] = caption
    return seen


def _iterate(data, epoch):
    loader = data.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return list(loader)


def test_rows_of_one_path_are_one_image_and_validation_takes_its_first_caption(tmp_path):
    data = many_captions(tmp_path)
    assert len(data.splits["train"]) == len(data.splits["val"]) == 10  # images, not rows
    assert sorted(data.captions("train")) == sorted(c for _, c in MANY)
    for _ in range(2):
        val = [c for _, captions in data.val_dataloader() for c in captions]
        assert val == [f"{i} a" for i in range(9)] + ["9 only"]  # first caption, table order, every time


def test_training_draws_one_caption_per_image_anew_each_epoch(tmp_path):
    data = many_captions(tmp_path)
    draws = [epoch_draws(data, epoch) for epoch in range(12)]
    assert all(len(d) == 10 for d in draws)  # drop_last: 10 images, batches of 5
    for i in range(9):
        assert {d[i] for d in draws} == {f"{i} a", f"{i} b", f"{i} c"}  # every caption turns up
    assert {d[9] for d in draws} == {"9 only"}
    orders = {tuple(c for _, cs in _iterate(data, e) for c in cs) for e in range(3)}
    assert len(orders) == 3  # the order changes with the epoch too


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_draw_is_fixed_by_seed_and_epoch_alone(tmp_path, num_workers):
    data = many_captions(tmp_path, num_workers=num_workers)
    run = [epoch_draws(data, epoch) for epoch in range(4)]
    # a fresh module (a resumed run) that starts at epoch 3, in worker processes or not, draws what the run drew
    again = many_captions(tmp_path, num_workers=num_workers)
    assert epoch_draws(again, 3) == run[3]
    assert [c for _, cs in _iterate(again, 3) for c in cs] == [c for _, cs in _iterate(data, 3) for c in cs]
    other = many_captions(tmp_path, seed=1)
    assert [epoch_draws(other, epoch) for epoch in range(4)] != run


def test_one_caption_per_image_is_always_that_caption(tmp_path):
    rows = [(f"{i}.png", f"{i} only") for i in range(6)]
    train = table(tmp_path / "train", rows, grey=lambda path: 10 * int(path[0]))
    data = CaptionTable(str(train), str(train), img_size=4, in_chans=1, mean=[0.0], std=[1.0], batch_size=3)
    data.setup("fit")
    for epoch in range(5):
        assert epoch_draws(data, epoch) == {i: f"{i} only" for i in range(6)}


def test_the_held_out_share_keeps_an_images_captions_together(tmp_path):
    data = many_captions(tmp_path, val=False)
    val_images = {path for path, _ in data.splits["val"].images}
    assert len(val_images) == 3 and not val_images & {path for path, _ in data.splits["train"].images}
    assert sorted(data.captions("train") + data.captions("val")) == sorted(c for _, c in MANY)
