"""ImageClassifier: parameter groups, schedule, losses, EMA, metrics and the checkpoint."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import TINY_DIM, quick_trainer, tiny_classifier
from vit.deploy import load_classifier
from vit.tasks import load_task
from vit.tasks.classify import ImageClassifier
from vit.tasks.finetune import Staged
from vit.tasks.heads import SingleLabelHead
from vit.tasks.optim import Optimization, warmup_cosine


def loader(n: int = 24, classes: int = 10, batch: int = 8, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.arange(n) % classes
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def test_schedule_keeps_layer_decay_per_step(tmp_path):
    model = tiny_classifier(optim=Optimization(lr=0.01, layer_decay=0.5, warmup_steps=4, min_lr=0.0))
    t = quick_trainer(tmp_path, max_steps=6)
    t.fit(model, loader())
    opt = t.optimizers[0]
    assert opt.defaults["fused"]  # on a CPU torch's default loop is 4x slower
    factor = warmup_cosine(6, 4, 6, 0.0)  # LambdaLR has stepped 6 times
    for g in opt.param_groups:  # layer{i}_..., and the head at the top layer (depth + 1 = 3)
        layer = 3 if g["name"].startswith("head_") else int(g["name"].split("_")[0].removeprefix("layer"))
        assert g["lr"] == pytest.approx(0.01 * 0.5 ** (3 - layer) * factor, abs=1e-12), g["name"]
    # warm-up in epochs: 3 batches per epoch, 1 warm-up epoch of 3 epochs -> 3 warm-up steps of 9
    lrs = []

    class RecordLr(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    model = tiny_classifier(optim=Optimization(lr=0.01, warmup_epochs=1, min_lr=0.0))
    quick_trainer(tmp_path, max_epochs=3, callbacks=[RecordLr()]).fit(model, loader())
    assert lrs == pytest.approx([0.01 * warmup_cosine(i, 3, 9, 0.0) for i in range(9)])
    assert lrs[:3] == pytest.approx([0.01 / 3, 0.02 / 3, 0.01])


def one_cycle(step: int, peak: float, warmup: int, total: int) -> tuple[float, float]:
    """Hand formula of OneCycleLR's lr and beta1 (cosine phases; lr peak/25 -> peak -> peak/25e4, beta1
    0.95 -> 0.85 -> 0.95), from Smith & Topin (2018) and torch's documented defaults."""
    cos = lambda start, end, pct: end + (start - end) / 2 * (1 + math.cos(math.pi * pct))
    if step <= warmup - 1:
        pct = step / (warmup - 1)
        return cos(peak / 25, peak, pct), cos(0.95, 0.85, pct)
    pct = (step - (warmup - 1)) / (total - 1 - (warmup - 1))
    return cos(peak, peak / 25 / 1e4, pct), cos(0.85, 0.95, pct)


def test_onecycle_schedule_is_the_plain_loops_per_group(tmp_path):
    seen = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append([(g["name"], g["lr"], g["betas"][0]) for g in trainer.optimizers[0].param_groups])

    model = tiny_classifier(optim=Optimization(lr=0.01, layer_decay=0.5, warmup_steps=3, schedule="onecycle"))
    quick_trainer(tmp_path, max_epochs=3, callbacks=[Record()]).fit(model, loader())  # 9 steps
    assert len(seen) == 9
    for step, groups in enumerate(seen):
        for name, lr, beta1 in groups:
            layer = 3 if name.startswith("head_") else int(name.split("_")[0].removeprefix("layer"))
            expected_lr, expected_beta1 = one_cycle(step, 0.01 * 0.5 ** (3 - layer), 3, 9)
            assert lr == pytest.approx(expected_lr, rel=1e-9) and beta1 == pytest.approx(expected_beta1), (step, name)
    for epochs, warmup in ((1, 5.0), (1, 0.0)):  # warm-up as long as the run, or none: still one cycle
        model = tiny_classifier(optim=Optimization(lr=0.01, warmup_epochs=warmup, schedule="onecycle"))
        quick_trainer(tmp_path, max_epochs=epochs).fit(model, loader())
        assert model.trainer.global_step == 3
    cyclic = tiny_classifier(optim=Optimization(schedule="onecycle"))
    quick_trainer(tmp_path, fast_dev_run=True).fit(cyclic, loader())  # one step
    with pytest.raises(ValueError, match="schedule must be"):
        Optimization(schedule="linear")
    with pytest.raises(ValueError, match="Staged"):
        tiny_classifier(optim=Optimization(schedule="onecycle"), finetune=Staged(head_epochs=1))


def test_losses_label_smoothing_and_mixup():
    model = tiny_classifier(head=SingleLabelHead(label_smoothing=0.1))
    assert isinstance(model.train_loss, torch.nn.CrossEntropyLoss) and model.train_loss.label_smoothing == 0.1
    from timm.loss import SoftTargetCrossEntropy as TimmSoftTarget

    from vit.tasks.losses import SoftTargetCrossEntropy

    model = tiny_classifier(head=SingleLabelHead(mixup_alpha=0.8, cutmix_alpha=1.0))
    assert isinstance(model.train_loss, SoftTargetCrossEntropy)
    assert model.mixup.mixup.mixup_alpha == 0.8 and model.mixup.mixup.cutmix_alpha == 1.0  # timm's Mixup
    logits, targets = torch.randn(6, 10), torch.randn(6, 10).softmax(-1)
    torch.testing.assert_close(model.train_loss(logits, targets), TimmSoftTarget()(logits, targets))
    # class weights: for one-hot targets, exactly torch's weighted cross-entropy
    weights = torch.rand(10) + 0.5
    labels = torch.randint(0, 10, (6,))
    weighted = SoftTargetCrossEntropy(weights)(logits, torch.nn.functional.one_hot(labels, 10).float())
    torch.testing.assert_close(weighted, torch.nn.functional.cross_entropy(logits, labels, weight=weights))


def test_mixup_training_runs_with_odd_batches(tmp_path):
    model = tiny_classifier(head=SingleLabelHead(mixup_alpha=0.8, cutmix_alpha=1.0))
    t = quick_trainer(tmp_path, max_steps=3)
    t.fit(model, loader(n=21, batch=7))
    assert t.global_step == 3 and torch.isfinite(t.callback_metrics["train_loss"])


def test_ema_is_used_for_eval_and_checkpointed(tmp_path):
    model = tiny_classifier(optim=Optimization(ema_decay=0.5, lr=0.01))
    # updated by averaging only: no gradients, so DDP has no unused trainable parameters
    assert not any(p.requires_grad for p in model.model_ema.parameters())
    assert all(p.requires_grad for p in model.model.parameters())
    t = quick_trainer(tmp_path, max_steps=4)
    t.fit(model, loader())
    x = torch.randn(3, 1, 8, 8)
    model.eval()
    ema_out, raw_out = model(x), model.model(x)
    torch.testing.assert_close(ema_out, model.model_ema.module(x))
    assert not torch.allclose(ema_out, raw_out)
    path = tmp_path / "ema.ckpt"
    t.save_checkpoint(path)
    assert any(k.startswith("model_ema.") for k in torch.load(path, weights_only=False)["state_dict"])
    loaded = load_classifier(path)  # the evaluated (EMA) weights, without Lightning
    torch.testing.assert_close(loaded.model(x), ema_out)
    task = load_task(path, ImageClassifier)  # the whole task, both copies
    torch.testing.assert_close(task(x), ema_out)
    torch.testing.assert_close(task.model(x), raw_out)


def test_metrics_match_a_hand_count_and_confusion_png(tmp_path):
    model = tiny_classifier()
    data = loader(n=40)
    t = quick_trainer(tmp_path, max_steps=1, logger=CSVLogger(tmp_path))
    t.fit(model, data)
    result = t.test(model, data, verbose=False)[0]
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in data])
    y = torch.cat([y for _, y in data])
    pred = logits.argmax(-1)
    assert result["test_acc"] == pytest.approx((pred == y).float().mean().item())
    top5 = logits.topk(5, dim=-1).indices
    assert result["test_acc_top5"] == pytest.approx((top5 == y[:, None]).any(-1).float().mean().item())
    confusion = model.evaluation.last_confusion_matrix
    expected = torch.zeros(10, 10, dtype=confusion.dtype)
    for true, predicted in zip(y.tolist(), pred.tolist()):
        expected[true, predicted] += 1  # row: true class, column: predicted class
    assert not torch.equal(expected, expected.T)  # so a transposed matrix would fail
    assert torch.equal(confusion, expected)
    for c in range(10):
        assert result[f"test_acc_class/{c}"] == pytest.approx(((pred == c) & (y == c)).sum().item() / 4)
    png = tmp_path / "lightning_logs" / "version_0" / "confusion_matrix.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # fewer than 5 classes: no top-5 metric
    logged = list(tiny_classifier(num_classes=3).evaluation.metrics["val"].keys())  # (`in` would ask unprefixed names)
    assert "val_acc_top5" not in logged and "val_acc" in logged


def test_nan_loss_is_an_error(tmp_path):
    model = tiny_classifier()
    x = torch.full((8, 1, 8, 8), math.nan)
    with pytest.raises(FloatingPointError, match="loss is nan"):
        quick_trainer(tmp_path, max_steps=1).fit(model, DataLoader(TensorDataset(x, torch.zeros(8).long()), 8))


def test_checkpoint_alone_rebuilds_the_classifier(tmp_path):
    names = [f"class{i}" for i in range(10)]
    model = tiny_classifier(class_names=names, mean=[0.3], std=[0.4], in_chans=1, img_size=8, crop_pct=0.9)
    t = quick_trainer(tmp_path, max_steps=1)
    t.fit(model, loader())
    path = tmp_path / "a.ckpt"
    t.save_checkpoint(path)
    loaded = load_classifier(path)
    assert not loaded.training
    assert loaded.class_names == names and loaded.img_size == (8, 8) and loaded.in_chans == 1
    assert loaded.mean == (0.3,) and loaded.std == (0.4,) and loaded.crop_pct == 0.9
    assert len(loaded.model.blocks) == 2 and loaded.model.embed_dim == TINY_DIM
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(loaded.model(x), model.eval().model(x))

    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match=r"other\.ckpt holds no `vit` task .*, but the ImageClassifier task "
                                         r"\('classify'\) is needed here"):
        load_classifier(tmp_path / "other.ckpt")
    torch.save({"state_dict": {}, "vit": {"task": "translate"}}, tmp_path / "translator.ckpt")
    wrong_task = (r"translator\.ckpt holds the Translator task \('translate'\), but the ImageClassifier task "
                  r"\('classify'\) is needed here: give a checkpoint that `vit fit` wrote with "
                  r"vit\.tasks\.ImageClassifier")
    with pytest.raises(ValueError, match=wrong_task):
        load_classifier(tmp_path / "translator.ckpt")
    with pytest.raises(ValueError, match=wrong_task):
        load_task(tmp_path / "translator.ckpt", ImageClassifier)
    with pytest.raises(FileNotFoundError, match=r"missing\.ckpt"):
        load_classifier(tmp_path / "missing.ckpt")


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="unknown model 'vit_nope'"):
        ImageClassifier(model="vit_nope")
    with pytest.raises(ValueError, match="3 class_names for num_classes=10"):
        ImageClassifier(class_names=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"one value per input channel \(1\)"):
        ImageClassifier(preprocessing={"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]})
    assert ImageClassifier().mean == (0.5,)
    rgb = ImageClassifier(model="vit_cifar_patch4_32", model_kwargs={"depth": 1})
    assert rgb.std == (0.229, 0.224, 0.225)


def test_compile_keeps_the_checkpoint_keys():
    torch.manual_seed(0)
    eager = tiny_classifier(optim=Optimization(ema_decay=0.9))
    torch.manual_seed(0)
    compiled = tiny_classifier(optim=Optimization(ema_decay=0.9), compile=True)
    assert compiled.hparams.compile and not eager.hparams.compile
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no "_orig_mod." anywhere
    assert all(not k.startswith("_orig_mod") for k in compiled.model.state_dict())


@pytest.mark.slow
def test_compiled_training_and_eval_match_eager(tmp_path):
    """torch.compile (inductor, on the CPU) changes the speed, not the numbers: loss, gradients, logits."""
    torch.manual_seed(0)
    eager = tiny_classifier()
    torch.manual_seed(0)
    compiled = tiny_classifier(compile=True)
    x, y = next(iter(loader()))
    losses = []
    for model in (eager, compiled):
        model.train()
        loss = model.train_loss(model.model(x), y)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0])
    for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(compiled.eval()(x), eager.eval()(x), atol=1e-5, rtol=1e-4)
    # a compiled fit writes a checkpoint that the Lightning-free loader reads
    t = quick_trainer(tmp_path, max_steps=2)
    t.fit(compiled.train(), loader())
    t.save_checkpoint(tmp_path / "compiled.ckpt")
    loaded = load_classifier(tmp_path / "compiled.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), compiled.eval()(x), atol=1e-5, rtol=1e-4)


def test_uint8_training_images_without_the_datamodule_hook_are_a_clear_error(tmp_path):
    images = torch.randint(0, 256, (8, 1, 8, 8), dtype=torch.uint8)  # what an image DataModule's workers hand over
    with pytest.raises(TypeError, match=r"arrived as uint8.*on_after_batch_transfer"):
        data = DataLoader(TensorDataset(images, torch.zeros(8).long()), 8)
        quick_trainer(tmp_path, max_steps=1).fit(tiny_classifier(), data)


def test_a_class_without_test_images_is_said_and_not_scored_zero(tmp_path, caplog, monkeypatch):
    import logging

    import vit.tasks.mistakes

    drawn = {}
    real_figure = vit.tasks.mistakes.class_accuracy_figure
    monkeypatch.setattr(vit.tasks.mistakes, "class_accuracy_figure",
                        lambda acc, names: drawn.setdefault("acc", acc) and real_figure(acc, names))
    model = tiny_classifier(num_classes=3)
    t = quick_trainer(tmp_path, max_steps=1)
    t.fit(model, loader(n=12, classes=3))
    x = torch.randn(8, 1, 8, 8)
    y = torch.tensor([0, 1] * 4)  # no image of class 2
    with caplog.at_level(logging.INFO):
        result = t.test(model, DataLoader(TensorDataset(x, y), batch_size=4), verbose=False)[0]
    with torch.no_grad():
        pred = model(x).argmax(-1)
    for c in (0, 1):
        assert result[f"test_acc_class/{c}"] == pytest.approx(((pred == c) & (y == c)).sum().item() / 4)
    assert "test_acc_class/2" not in result  # torchmetrics would say 0.0
    assert "no test images of '2'" in caplog.text
    assert math.isnan(drawn["acc"][2]) and not any(math.isnan(a) for a in drawn["acc"][:2])


@pytest.mark.parametrize("tta", ["none", "flip"])
def test_the_test_report_averages_the_mirror_only_when_calibration_chose_it(fitted, tta):
    """`vit fit` sets ``test_tta`` from the calibrated checkpoint; test logits are then mean(model(x), model(flip))."""
    from vit.tasks import ImageClassifier

    task = ImageClassifier.load_from_checkpoint(next((fitted / "ckpt").glob("best-*.ckpt")), map_location="cpu").eval()
    task.test_tta = tta
    x, y = torch.randn(3, 1, 16, 16), torch.tensor([0, 1, 2])  # the digits recipe's images
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        got = task._eval_step((x, y), "test")
        plain, mirrored = task(x), task(torch.flip(x, dims=[3]))
    torch.testing.assert_close(got, (plain + mirrored) / 2 if tta == "flip" else plain)
    assert not torch.allclose(plain, mirrored)
