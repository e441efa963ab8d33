"""scripts/experiments/digits_clip.py's parts that decide what its figures mean: batches of different digits, the
held-out templates kept out of training, the fine-tune's plain images and its keep-the-better rule, and one
seed end to end on a saved (untrained) CLIP (the figures are in docs/zeroshot.md)."""

import pytest
import torch

from tests import load_script
from vit.data.captions import CaptionSampler


@pytest.mark.parametrize(("counts", "batch_size"), [((5, 5, 4, 3, 3), 5), ((7, 2, 2, 1), 2), ((3, 3, 3), 3)])
def test_distinct_digits_batches_hold_different_digits_and_their_count_is_exact(counts, batch_size):
    clip = load_script("digits_clip")
    labels = [digit for digit, n in enumerate(counts) for _ in range(n)]
    sampler = CaptionSampler(len(labels), seed=3)
    batches = clip.DistinctDigits(sampler, labels, batch_size)
    seen = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        drawn = list(batches)
        assert len(drawn) == len(batches)  # what Lightning counts the epoch's steps by
        for batch in drawn:
            assert len(batch) == batch_size and len({labels[i % len(labels)] for i in batch}) == batch_size
            assert all(i // len(labels) == epoch for i in batch)  # the indices carry the epoch (caption draw)
        flat = [i % len(labels) for batch in drawn for i in batch]
        assert len(set(flat)) == len(flat)  # no image twice in an epoch
        seen.append(drawn)
    # the count by hand: (5,5,4,3,3) in 5s: 3 batches; (7,2,2,1) in pairs: 5 (7 with each other digit); 3s: 3
    assert len(seen[0]) == {5: 3, 2: 5, 3: 3}[batch_size]
    sampler.set_epoch(1)
    assert list(batches) == seen[1]  # the seed and the epoch fix the batches


def test_no_training_caption_holds_a_held_out_phrasing():
    clip = load_script("digits_clip")
    training = [c for d in range(10) for c in clip.captions(d, clip.TEN_TEMPLATES + clip.MORE_TEMPLATES)]
    assert len(training) == 10 * len(clip.TEN_TEMPLATES + clip.MORE_TEMPLATES) == 380
    for phrase in ("a picture of", "a photo of the digit", "this is a", "picture", "photo", "this"):
        assert not [c for c in training if phrase in c.split() or phrase in c], phrase
    assert clip.HELD_OUT == ("a picture of {}", "a photo of the digit {}", "this is a {}")
    names = [(str(d), clip.WORDS[d]) for d in range(10)]
    for digit in range(10):  # every caption names its digit, as a numeral or a word, and no other digit
        for caption in clip.captions(digit, clip.TEN_TEMPLATES + clip.MORE_TEMPLATES):
            named = {d for d, pair in enumerate(names) if set(pair) & set(caption.replace(":", "").split())}
            assert named == {digit}, caption


@pytest.mark.parametrize(("val", "kept"), [
    ([0.90, 0.95, 0.91], -1),  # the end beats the start on validation: the fine-tuned end
    ([0.91, 0.80, 0.91], 0),  # a tie keeps the start (the zero-shot head)
    ([0.92, 0.99, 0.91], 0),  # the end under the start: the start, whatever the epochs between scored
])
def test_the_recipe_keeps_the_fine_tune_only_when_it_beats_the_start_on_validation(val, kept):
    assert load_script("digits_clip").keep_better(val) == kept


def test_the_fine_tune_trains_on_the_plain_images_the_contrastive_training_saw():
    """The random affine took the zero-shot head's fine-tune from 0.917 to 0.848 (docs/zeroshot.md): off by default,
    the training images are scikit-learn's digits / 16, normalised with the digits' mean and std; --ft_affine
    turns it back on (two reads of an image differ)."""
    from sklearn.datasets import load_digits

    clip = load_script("digits_clip")
    plain = clip.fine_tune_data(1, clip.parse([]).ft_affine).train_set
    pixels = torch.tensor(load_digits().images, dtype=torch.float32) / 16.0
    for i in (0, 7, len(plain) - 1):
        expected = (pixels[plain.indices[i]] - 0.3053) / 0.3760
        torch.testing.assert_close(plain[i][0][0], expected, atol=1e-6, rtol=0)
        assert int(plain[i][1]) == int(load_digits().target[plain.indices[i]])
    affine = clip.fine_tune_data(1, clip.parse(["--ft_affine"]).ft_affine).train_set
    torch.manual_seed(0)
    assert any(not torch.equal(affine[i][0], affine[i][0]) for i in range(8))


def test_a_seed_on_a_saved_clip_keeps_in_kept_ckpt_what_validation_picked(tmp_path):
    """--reuse reads the seed's clip.ckpt (no contrastive training); kept.ckpt is finetuned.ckpt when the zero-shot
    head's fine-tune ended above its start on validation, zeroshot.ckpt otherwise, and "kept" is that one's top-1."""
    from vit.checkpoints.io import save_checkpoint
    from vit.tasks.contrastive import ContrastiveTask

    clip = load_script("digits_clip")
    task = ContrastiveTask(vision="vit_digits_patch2_8", vision_kwargs=clip.VISION_KWARGS, img_size=8, in_chans=1,
                           text=clip.TEXT, embed_dim=64, context_length=40)
    folder = tmp_path / "seed0"
    state = {f"clip.{k}": v for k, v in task.clip.state_dict().items()}
    save_checkpoint({"vit": task.checkpoint_meta(), "state_dict": state}, folder / "clip.ckpt")
    before = (folder / "clip.ckpt").read_bytes()
    result = clip.run_seed(0, tmp_path, clip.parse(["--reuse", "--ft_epochs", "1", "--seeds", "0"]))
    assert (folder / "clip.ckpt").read_bytes() == before and result["zeroshot_curve"] is None  # not retrained
    start, end = result["val_start_end"]
    picked = "finetuned.ckpt" if end > start else "zeroshot.ckpt"
    assert (folder / "kept.ckpt").read_bytes() == (folder / picked).read_bytes()
    assert result["kept"] == result["curve_zeroshot_head"][-1 if end > start else 0]


def test_the_recipe_is_the_arm_measured_best_and_the_arms_script_runs_it_last():
    """docs/zeroshot.md's fine-tune: plain images, lr 5e-4 at the head, layer decay 0.75, a one-epoch warm-up,
    20 epochs, smoothing 0.1, the head at the CLIP's scale; digits_clip_finetune.py's last arm is those defaults."""
    clip, arms = load_script("digits_clip"), load_script("digits_clip_finetune")
    recipe = vars(clip.parse([]))
    assert {k: v for k, v in recipe.items() if k.startswith("ft_") or k == "layer_decay"} == {
        "ft_epochs": 20, "ft_affine": False, "ft_lr": 5e-4, "ft_warmup": 1.0, "layer_decay": 0.75,
        "ft_smoothing": 0.1, "ft_head_scale": 1.0}
    last = list(arms.ARMS)[-1]
    assert "new recipe" in last and vars(clip.parse(arms.OLD_TEN + arms.ARMS[last])) == recipe
    old = vars(clip.parse(arms.OLD_TEN + arms.ARMS[next(iter(arms.ARMS))]))
    assert old["ft_affine"] and old["ft_epochs"] == 10 and old["ft_warmup"] == 0.0  # the recipe before (0.852)
