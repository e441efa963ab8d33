"""The contrastive task: CLIP's and SigLIP's losses against open_clip's, both towers trained on caption pairs, the
checkpoint that rebuilds them, the zero-shot classifier they make, and `head_init: zeroshot` in the classifier."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss, SigLipLoss

from tests.helpers import DIGITS_VIT, TINY, TINY_DIM, quick_trainer
from vit.errors import UserValueError
from vit.tasks import ImageClassifier
from vit.tasks.contrastive import ContrastiveTask, load_contrastive, zeroshot_classifier, zeroshot_start
from vit.tasks.finetune import Full, LinearProbe, Partial, Staged
from vit.tasks.losses import clip_loss, siglip_loss

TEXT = {"depth": 1, "embed_dim": TINY_DIM, "num_heads": 2}


def tiny_task(**kwargs) -> ContrastiveTask:
    torch.manual_seed(0)
    options = dict(vision=DIGITS_VIT, vision_kwargs=TINY, img_size=8, in_chans=1, text=TEXT, embed_dim=16,
                   context_length=16, warmup_epochs=0)
    return ContrastiveTask(**{**options, **kwargs})


def features(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, 8, generator=g), dim=-1), F.normalize(torch.randn(n, 8, generator=g), dim=-1)


@pytest.mark.parametrize("n", [1, 2, 6])
def test_clip_loss_is_open_clips_and_the_hand_formula(n):
    image, text = features(n)
    scale = torch.tensor(14.3)
    ours = clip_loss(image, text, scale)
    torch.testing.assert_close(ours, ClipLoss()(image, text, scale))
    logits = (scale * image @ text.T).tolist()  # by hand: -log softmax of the diagonal, rows and columns
    rows = [math.log(sum(math.exp(v) for v in logits[i])) - logits[i][i] for i in range(n)]
    cols = [math.log(sum(math.exp(logits[j][i]) for j in range(n))) - logits[i][i] for i in range(n)]
    assert float(ours) == pytest.approx((sum(rows) + sum(cols)) / (2 * n), rel=1e-5)


@pytest.mark.parametrize("n", [1, 2, 6])
def test_siglip_loss_is_open_clips_and_the_hand_formula(n):
    image, text = features(n, seed=1)
    scale, bias = torch.tensor(10.0), torch.tensor(-10.0)
    ours = siglip_loss(image, text, scale, bias)
    torch.testing.assert_close(ours, SigLipLoss()(image, text, scale, bias))
    z = (scale * image @ text.T + bias).tolist()
    by_hand = sum(math.log1p(math.exp(-z[i][j] if i == j else z[i][j])) for i in range(n) for j in range(n)) / n
    assert float(ours) == pytest.approx(by_hand, rel=1e-5)


def pairs(n=32):
    """Two kinds of 8x8 images (a bright top half, bright all over) and a caption naming each."""
    images = torch.full((n, 1, 8, 8), -1.0)
    for i in range(n):
        images[i, 0, : 4 if i % 2 == 0 else 8] = 1.0
    return [(images[i], "top" if i % 2 == 0 else "all") for i in range(n)]


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_both_towers_learn_to_pair_images_with_their_captions(tmp_path, loss):
    task = tiny_task(loss=loss, lr=5e-3)
    assert (task.clip.logit_bias is not None) == (loss == "siglip")
    loader = torch.utils.data.DataLoader(pairs(), batch_size=8, shuffle=True)
    before = {name: p.detach().clone() for name, p in task.clip.named_parameters()}
    quick_trainer(tmp_path, max_steps=25).fit(task, loader)
    still = [name for name, p in task.clip.named_parameters() if torch.equal(p, before[name])]
    assert not still  # both towers, the scale (and the bias) all train
    clip = task.clip.eval()
    images = torch.stack([pairs(2)[0][0], pairs(2)[1][0]])
    with torch.no_grad():
        logits = clip(images, task.tokenizer(["top", "all"]))
    assert torch.equal(logits.argmax(-1), torch.tensor([0, 1]))  # each image scores its own caption higher


def test_the_checkpoint_rebuilds_both_towers_and_the_tokenizer(tmp_path):
    task = tiny_task(loss="siglip")
    quick_trainer(tmp_path, max_steps=2).fit(task, torch.utils.data.DataLoader(pairs(8), batch_size=4))
    task.trainer.save_checkpoint(tmp_path / "clip.ckpt")
    clip, tokenizer = load_contrastive(tmp_path / "clip.ckpt")
    images, ids = torch.randn(3, 1, 8, 8), tokenizer(["top", "all"])
    assert torch.equal(ids, task.tokenizer(["top", "all"]))
    with torch.no_grad():
        torch.testing.assert_close(clip(images, ids), task.clip.eval()(images, ids))


def test_an_unknown_loss_is_refused():
    with pytest.raises(UserValueError, match="loss must be one of clip, siglip"):
        tiny_task(loss="infonce")
    with pytest.raises(UserValueError, match="tokenizer must be one of char, word"):
        tiny_task(tokenizer="bpe")


class WordPairs(pl.LightningDataModule):
    """`pairs` with word captions, and the training captions as `CaptionTable.captions` gives them."""

    def setup(self, stage=None):
        self.pairs = [(image, "a bar on top" if caption == "top" else "it is all lit") for image, caption in pairs()]

    def captions(self, split="train"):
        return [caption for _, caption in self.pairs]

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.pairs, batch_size=8, shuffle=True)


def test_a_word_tokenizer_takes_the_training_captions_words_and_round_trips(tmp_path):
    task = tiny_task(tokenizer="word", lr=5e-3)
    assert task.clip is None  # no vocabulary before the data
    quick_trainer(tmp_path, max_steps=60).fit(task, datamodule=WordPairs())
    # the words by hand: 4 special ids, then "a bar on top it is all lit" by count (all once: alphabetical)
    words = sorted(["a", "bar", "on", "top", "it", "is", "all", "lit"])
    assert task.tokenizer.vocab_size == 4 + len(words) + 1 == task.clip.text.config.vocab_size
    eot = 4 + len(words)
    expected = [2, 4 + words.index("a"), 1, 4 + words.index("top"), eot] + [0] * 11  # "picture": unknown
    assert task.tokenizer("A picture TOP")[0].tolist() == expected
    clip = task.clip.eval()
    images = torch.stack([pairs(2)[0][0], pairs(2)[1][0]])
    with torch.no_grad():
        logits = clip(images, task.tokenizer(["a bar on top", "it is all lit"]))
    assert torch.equal(logits.argmax(-1), torch.tensor([0, 1]))
    task.trainer.save_checkpoint(tmp_path / "clip.ckpt")
    loaded, tokenizer = load_contrastive(tmp_path / "clip.ckpt")
    assert torch.equal(tokenizer(["A picture TOP"]), task.tokenizer(["A picture TOP"]))
    with torch.no_grad():
        torch.testing.assert_close(loaded(images, tokenizer(["top"])), clip(images, task.tokenizer(["top"])))


def test_a_word_tokenizer_needs_a_caption_table(tmp_path):
    with pytest.raises(UserValueError, match="tokenizer: word builds its vocabulary from the training captions"):
        quick_trainer(tmp_path, max_steps=1).fit(tiny_task(tokenizer="word"), torch.utils.data.DataLoader(pairs(4)))


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_the_zeroshot_classifier_scores_template_averaged_text_embeddings(family):
    task = tiny_task(loss=family)
    clip, tok = task.clip.eval(), task.tokenizer
    with torch.no_grad():
        clip.logit_scale.fill_(math.log(7.0))
        templates, names = ("a {}", "the {} here"), ["top", "bottom", "left"]
        classifier = zeroshot_classifier(clip, tok, names, templates)
        images = torch.randn(4, 1, 8, 8)
        # by hand: mean over templates of the unit text embeddings, unit length again, x scale (+ bias)
        rows = torch.stack([F.normalize(F.normalize(clip.encode_text(tok([t.format(n) for t in templates])), dim=-1)
                                        .mean(0), dim=0) for n in names])
        expected = 7.0 * F.normalize(clip.encode_image(images), dim=-1) @ rows.T
        expected = expected + (clip.logit_bias if family == "siglip" else 0.0)
        torch.testing.assert_close(classifier(images), expected)


def test_a_template_without_a_place_for_the_name_is_refused():
    task = tiny_task()
    with pytest.raises(UserValueError, match="'a photo'"):
        zeroshot_classifier(task.clip, task.tokenizer, ["a"], ("a {}", "a photo"))


def clip_checkpoint(tmp_path):
    task = tiny_task()
    quick_trainer(tmp_path, max_steps=1).fit(task, torch.utils.data.DataLoader(pairs(4), batch_size=4))
    task.trainer.save_checkpoint(tmp_path / "clip.ckpt")
    (tmp_path / "templates.txt").write_text("a {}\nthe {} here\n")
    return tmp_path / "clip.ckpt", task


TOWER = {**TINY, "proj_dim": 16, "normalize_embedding": True}


@pytest.mark.parametrize("finetune", [Full(), LinearProbe(), Partial(freeze_blocks=1), Staged(head_epochs=1)])
def test_head_init_zeroshot_starts_the_classifier_at_the_zeroshot_logits(tmp_path, finetune):
    path, task = clip_checkpoint(tmp_path)
    names = ["top", "bottom"]
    torch.manual_seed(0)
    classifier = ImageClassifier(model=DIGITS_VIT, model_kwargs=TOWER, num_classes=2, class_names=names,
                                 pretrained=str(path), head_init=f"zeroshot:{tmp_path / 'templates.txt'}",
                                 finetune=finetune)
    classifier.configure_model()
    expected = zeroshot_classifier(task.clip.eval(), task.tokenizer, names, ("a {}", "the {} here"))
    images = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(classifier.eval()(images), expected(images))


def test_head_init_random_leaves_the_head_alone():
    torch.manual_seed(0)
    classifier = ImageClassifier(model=DIGITS_VIT, model_kwargs=TOWER, num_classes=2, class_names=["a", "b"])
    before = classifier.model.head.weight.clone()
    classifier.configure_model()  # no pretrained: nothing read
    assert torch.equal(classifier.model.head.weight, before)


def test_head_init_zeroshot_names_the_architecture_to_set(tmp_path):
    path, _ = clip_checkpoint(tmp_path)
    classifier = ImageClassifier(model=DIGITS_VIT, model_kwargs=TINY, num_classes=2, class_names=["a", "b"],
                                 pretrained=str(path), head_init="zeroshot:photo")
    with pytest.raises(UserValueError) as caught:
        classifier.configure_model()
    message = str(caught.value)
    assert "\n" not in message and "proj_dim: 16" in message and "normalize_embedding: True" in message


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"head_init": "text"}, "head_init must be one of random, zeroshot"),
    ({"head_init": "zeroshot"}, "set pretrained to a CLIP"),
    ({"head_init": "zeroshot", "pretrained": "x.ckpt", "backbone": "timm"}, "backbone 'timm' cannot take it"),
])
def test_head_init_mistakes_are_named(kwargs, said):
    with pytest.raises(UserValueError, match=said):
        ImageClassifier(model=DIGITS_VIT, model_kwargs=TINY, **kwargs)


def test_zeroshot_start_loads_a_model_of_the_towers_architecture(tmp_path):
    path, task = clip_checkpoint(tmp_path)
    import vit

    model = vit.create_model(DIGITS_VIT, **TOWER, num_classes=3).eval()
    zeroshot_start(model, path, ["a", "b", "c"], str(tmp_path / "templates.txt"))
    torch.testing.assert_close(model.head.weight.norm(dim=1), task.clip.logit_scale.exp().detach().expand(3))


def test_a_checkpoint_of_another_task_is_named_not_a_key_error(tmp_path):
    """`expect_task(…, "contrastive")` once indexed a registry without contrastive while building its message."""
    torch.save({"vit": {"task": "classify"}, "state_dict": {}}, tmp_path / "classifier.ckpt")
    said = (r"classifier\.ckpt holds the ImageClassifier task \('classify'\), but the ContrastiveTask task "
            r"\('contrastive'\) is needed here: give a checkpoint that `vit fit` wrote with "
            r"vit\.tasks\.ContrastiveTask")
    with pytest.raises(UserValueError, match=said):
        load_contrastive(tmp_path / "classifier.ckpt")
    with pytest.raises(UserValueError, match=r"the checkpoint holds the ImageClassifier task"):
        tiny_task().on_load_checkpoint({"vit": {"task": "classify"}})
