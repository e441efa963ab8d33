"""Distillation (DeiT): the hard and soft losses against hand computations, the frozen teacher, the class check,
the student in timm's VisionTransformerDistilled, and the commands on one distilled checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from lightning.pytorch import Callback
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import built_once, short_digits_run
from tests.helpers import TINY, TINY_DIM, quick_trainer, random_images, tiny_classifier
from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import evaluated_weights
from vit.deploy import load_classifier
from vit.errors import UserPathError, UserValueError
from vit.tasks.classify import ImageClassifier
from vit.tasks.distill import DistilledClassifier, Teacher, hard_distillation, soft_distillation
from vit.tasks.heads import SingleLabelHead
from vit.tasks.optim import Optimization

pytestmark = pytest.mark.usefixtures("one_thread")
DIGITS = [str(i) for i in range(10)]


def student(head: dict | None = None, optim: dict | None = None, **kwargs) -> DistilledClassifier:
    """A tiny distilled student for 1-channel 8x8 images of 10 classes."""
    head = SingleLabelHead(**{"label_smoothing": 0.0, **(head or {})})
    return DistilledClassifier(**{"distillation": "hard", **kwargs}, model="vit_digits_patch2_8",
                               model_kwargs=dict(TINY), head=head, optim=Optimization(**(optim or {})))


def loader(n: int = 16, batch: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.arange(n) % 10), batch_size=batch)


# ---- hand computations: no torch.nn.functional loss, written out from the definitions --------------------
def hand_ce(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """-sum(q log p), q = one-hot (1 - eps) + eps / K, averaged over the batch."""
    logits = logits.double()
    p = torch.exp(logits) / torch.exp(logits).sum(1, keepdim=True)
    q = torch.full_like(p, smoothing / p.shape[1])
    q[torch.arange(len(target)), target] += 1 - smoothing
    return -(q * torch.log(p)).sum(1).mean()


def hand_kl(teacher: torch.Tensor, dist: torch.Tensor, tau: float) -> torch.Tensor:
    """KL(P_t || P_s) = sum P_t (log P_t - log P_s), with P = softmax(logits / tau), averaged over the batch."""
    soft = lambda z: torch.exp(z.double() / tau) / torch.exp(z.double() / tau).sum(1, keepdim=True)
    pt, ps = soft(teacher), soft(dist)
    return (pt * (torch.log(pt) - torch.log(ps))).sum(1).mean()


def test_hard_and_soft_losses_are_the_formulas():
    g = torch.Generator().manual_seed(1)
    cls, dist, teacher = (torch.randn(6, 5, generator=g) * 3 for _ in range(3))
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    base = hand_ce(cls, y)
    for alpha in (0.0, 0.3, 1.0):
        expected = (1 - alpha) * base + alpha * hand_ce(dist, teacher.argmax(1))
        got = hard_distillation(base, dist, teacher, alpha).double()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        for tau in (1.0, 3.0):
            expected = (1 - alpha) * base + alpha * tau**2 * hand_kl(teacher, dist, tau)
            torch.testing.assert_close(soft_distillation(base, dist, teacher, alpha, tau).double(), expected,
                                       rtol=1e-5, atol=1e-6)


class FixedTeacher(torch.nn.Module):
    """A teacher whose answer is a fixed linear map of the image, and which records what it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        return self.linear(x.flatten(1)) * 5


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_the_training_step_is_the_hand_formula(mode):
    torch.manual_seed(0)
    model = student(distillation=mode, distill_alpha=0.3, distill_tau=2.0, head={"label_smoothing": 0.1})
    model.configure_losses()
    network = FixedTeacher()
    model.teacher = Teacher(network, "fixed", DIGITS)
    x, y = next(iter(loader()))
    model.train()
    loss, logits = model.loss_and_logits(x, y)
    with torch.no_grad():
        model.model.distilled_training = True
        cls, dist = model.model(x)
        teacher = network.linear(x.flatten(1)) * 5
    base = hand_ce(cls, y, smoothing=0.1)
    extra = hand_ce(dist, teacher.argmax(1)) if mode == "hard" else 4.0 * hand_kl(teacher, dist, 2.0)
    torch.testing.assert_close(loss.double(), 0.7 * base + 0.3 * extra)
    torch.testing.assert_close(logits, (cls + dist) / 2)
    assert model.eval()(x).shape == (8, 10)  # inference: one answer, the mean of the two heads
    torch.testing.assert_close(model(x), (model.model.head(model.model.forward_features(x)[:, 0])
                                          + model.model.head_dist(model.model.forward_features(x)[:, 1])) / 2)


def test_with_mixup_the_teacher_sees_the_students_mixed_images(tmp_path):
    model = student(head={"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, class_names=DIGITS)
    model.teacher = Teacher(network := FixedTeacher(), "fixed", DIGITS)
    shown: list[torch.Tensor] = []
    model.model.register_forward_pre_hook(lambda module, args: shown.append(args[0].clone()) if module.training
                                          else None)
    quick_trainer(tmp_path, max_steps=1, limit_val_batches=0).fit(model, loader())
    x = next(iter(loader()))[0]
    assert len(shown) == len(network.seen) == 1
    assert not torch.allclose(shown[0], x)  # mixed...
    torch.testing.assert_close(network.seen[0], shown[0], atol=0, rtol=0)  # ... and the same for both


class Recorder(torch.nn.Module):
    """A teacher network that records what it was shown and answers zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        return torch.zeros(len(x), 10)


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_the_teacher_sees_the_students_images_resized_to_its_own_size(interpolation):
    # A 16x16 teacher of an 8x8 student: torch's own resize of the batch, by the teacher's interpolation; a batch
    # already at 16x16 goes through untouched.
    teacher = Teacher(network := Recorder(), "recorder", DIGITS, img_size=(16, 16), interpolation=interpolation)
    small, large = torch.randn(3, 1, 8, 8), torch.randn(3, 1, 16, 16)
    teacher(small)
    teacher(large)
    expected = torch.nn.functional.interpolate(small, size=(16, 16), mode=interpolation, align_corners=False)
    torch.testing.assert_close(network.seen[0], expected, atol=0, rtol=0)
    torch.testing.assert_close(network.seen[1], large, atol=0, rtol=0)


@pytest.fixture(scope="module")
def teacher_ckpt(tmp_path_factory) -> Path:
    """A tiny ViT teacher for 8x8 digits, trained two steps by a Trainer."""
    def build(root: Path) -> None:
        model = tiny_classifier(class_names=DIGITS)
        t = quick_trainer(root, max_steps=2)
        t.fit(model, loader())
        t.save_checkpoint(root / "teacher.ckpt")
    return built_once(tmp_path_factory, "distill_teacher", build) / "teacher.ckpt"


class Watch(Callback):
    """Records, at every training batch, that the teacher is in eval mode and takes no gradient."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        network = pl_module.teacher.network
        self.seen.append((network.training, any(p.grad is not None or p.requires_grad for p in network.parameters())))


def test_the_teacher_is_frozen_unoptimised_and_not_saved(tmp_path, teacher_ckpt):
    model = student(teacher=str(teacher_ckpt), class_names=DIGITS, optim={"ema_decay": 0.9})
    watch = Watch()
    t = quick_trainer(tmp_path, max_steps=2, callbacks=[watch], logger=True)
    t.fit(model, loader())
    teacher = model.teacher.network
    before = load_classifier(teacher_ckpt).model.state_dict()
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # unchanged
    assert watch.seen == [(False, False)] * 2  # eval mode and no gradient, at every step
    groups = {id(p): group["name"] for group in t.optimizers[0].param_groups for p in group["params"]}
    assert groups[id(model.model.head_dist.weight)] == groups[id(model.model.head.weight)] == "head_decay"
    optimised = set(groups)
    assert not optimised & {id(p) for p in teacher.parameters()}
    assert not any(id(p) in {id(q) for q in model.parameters()} for p in teacher.parameters())
    t.save_checkpoint(tmp_path / "student.ckpt")
    checkpoint = read_checkpoint(tmp_path / "student.ckpt")
    assert checkpoint["state_dict"].keys() == model.state_dict().keys()
    assert all(k.startswith(("model.", "model_ema.")) for k in checkpoint["state_dict"])  # no teacher.*
    assert checkpoint["vit"]["teacher"] == str(teacher_ckpt)
    assert "teacher_ms" in t.callback_metrics  # its forward, timed
    # a resumed run reads the student back and loads the teacher again, from its source
    resumed = student(teacher=str(teacher_ckpt), class_names=DIGITS, optim={"ema_decay": 0.9})
    quick_trainer(tmp_path, max_steps=3).fit(resumed, loader(), ckpt_path=tmp_path / "student.ckpt")
    assert resumed.global_step == 3 and resumed.teacher is not None
    # the teacher follows the student's moves and casts (what Lightning does on every rank)
    model.double()
    assert next(teacher.parameters()).dtype == torch.float64 and not teacher.training
    # the checkpoint alone rebuilds the student, which answers with the mean of its heads
    classifier = load_classifier(tmp_path / "student.ckpt")
    assert type(classifier.model).__name__ == "DistilledVisionTransformer"


def test_the_teacher_must_know_the_classes_in_the_same_order(tmp_path, teacher_ckpt):
    reordered = [*DIGITS[1:], DIGITS[0]]
    with pytest.raises(UserValueError, match=r"trained on the classes \['0', '1'.*this run's data has \['1', '2'.*"
                                             r"the same names in another order"):
        quick_trainer(tmp_path, max_steps=2).fit(student(teacher=str(teacher_ckpt), class_names=reordered), loader())
    others = [*DIGITS[:9], "ten"]
    with pytest.raises(UserValueError, match=r"the teacher lacks \['ten'\], the data lacks \['9'\]"):
        quick_trainer(tmp_path, max_steps=2).fit(student(teacher=str(teacher_ckpt), class_names=others), loader())
    with pytest.raises(UserValueError, match="distillation needs a teacher"):
        quick_trainer(tmp_path, max_steps=2).fit(student(), loader())
    with pytest.raises(UserValueError, match="teacher: best needs teacher_dir"):
        quick_trainer(tmp_path, max_steps=2).fit(student(teacher="best"), loader())
    with pytest.raises(UserPathError, match=r"no best\*\.ckpt in .*Train the teacher first"):
        quick_trainer(tmp_path, max_steps=2).fit(student(teacher="best", teacher_dir=str(tmp_path)), loader())
    for bad, message in (({"distillation": "medium"}, "distillation must be one of"),
                         ({"distill_alpha": 1.5}, "distill_alpha"), ({"distill_tau": 0}, "distill_tau")):
        with pytest.raises(UserValueError, match=message):
            student(**bad)


def test_teacher_best_is_the_newest_best_checkpoint_of_teacher_dir(tmp_path, teacher_ckpt):
    import os
    import shutil

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    shutil.copy(teacher_ckpt, folder / "best-epoch=0-step=1.ckpt")
    torch.save({"vit": {"task": "pretrain"}}, folder / "best-epoch=9-step=9.ckpt")
    os.utime(folder / "best-epoch=0-step=1.ckpt", (2e9, 2e9))  # the newest
    model = student(teacher="best", teacher_dir=str(folder), class_names=DIGITS)
    quick_trainer(tmp_path, max_steps=1).fit(model, loader())
    assert model.teacher.source == str(folder / "best-epoch=0-step=1.ckpt")

    # teacher_dir may be the run folder Lightning wrote: its checkpoints/, or its newest <version>/checkpoints/
    from vit.tasks.distill import resolve

    assert resolve("best", str(tmp_path)) == folder / "best-epoch=0-step=1.ckpt"
    runs = tmp_path / "logs" / "teacher_small"
    for version, mtime in (("version_0", 2e9), ("version_1", 1e9)):
        (runs / version / "checkpoints").mkdir(parents=True)
        shutil.copy(teacher_ckpt, runs / version / "checkpoints" / "best-epoch=0-step=1.ckpt")
        os.utime(runs / version / "checkpoints" / "best-epoch=0-step=1.ckpt", (mtime, mtime))
    assert resolve("best", str(runs)) == runs / "version_0" / "checkpoints" / "best-epoch=0-step=1.ckpt"


def test_a_timm_convnet_teacher_from_a_name_and_weights(tmp_path):
    from safetensors.torch import save_file

    net = timm.create_model("resnet10t", num_classes=10, in_chans=1)
    save_file(net.state_dict(), str(tmp_path / "resnet.safetensors"))
    model = student(teacher="resnet10t", teacher_weights=str(tmp_path / "resnet.safetensors"), class_names=DIGITS)
    quick_trainer(tmp_path, max_steps=1).fit(model, loader())
    x = next(iter(loader()))[0]
    torch.testing.assert_close(model.teacher(x), net.eval()(x))
    with pytest.raises(UserValueError, match="do not fit timm's resnet10t with 5 classes"):
        wrong = student(teacher="resnet10t", teacher_weights=str(tmp_path / "resnet.safetensors"), num_classes=5)
        quick_trainer(tmp_path, max_steps=2).fit(wrong, loader())


# ---- one distilled checkpoint, through `vit fit`, for the checks of what reads it ---------------------------
@pytest.fixture(scope="module")
def distilled(tmp_path_factory, fitted) -> Path:
    """`vit fit` of the digits recipe, a tiny student distilled (hard) from the `fitted` digits checkpoint."""
    from vit.commands import main

    teacher = next((fitted / "ckpt").glob("best-*.ckpt"))
    root = built_once(tmp_path_factory, "distilled", lambda root: main(["fit", *short_digits_run(
        root, "--model.class_path=vit.tasks.DistilledClassifier", "--model.init_args.distillation=hard",
        f"--model.init_args.teacher={teacher}")]))
    return next((root / "ckpt").glob("best-*.ckpt"))


def timm_distilled(config) -> torch.nn.Module:
    """timm's VisionTransformerDistilled with the student's sizes."""
    from timm.models.deit import VisionTransformerDistilled

    return VisionTransformerDistilled(
        img_size=config.img_size, patch_size=config.patch_size, in_chans=config.in_chans,
        num_classes=config.num_classes, embed_dim=config.embed_dim, depth=config.depth, num_heads=config.num_heads,
        mlp_ratio=config.mlp_ratio, qkv_bias=config.qkv_bias,
    ).eval()


def test_the_student_loads_into_timms_VisionTransformerDistilled(distilled):
    checkpoint = read_checkpoint(distilled)
    weights = evaluated_weights(checkpoint["state_dict"], checkpoint["vit"]["ema"])
    classifier = load_classifier(distilled)
    theirs = timm_distilled(classifier.model.config)
    theirs.load_state_dict(weights, strict=True)
    x = torch.randn(4, 1, 16, 16)
    with torch.no_grad():
        assert (theirs(x) - classifier(x)).abs().max() <= 1e-4
        theirs.set_distilled_training(True)  # and each head alone, in training mode
        theirs.train()
        cls, dist = theirs(x)
        classifier.model.distilled_training = True
        ours = classifier.model.train()(x)
    assert (cls - ours[0]).abs().max() <= 1e-4 and (dist - ours[1]).abs().max() <= 1e-4


def test_predict_export_attention_and_probe_read_a_distilled_checkpoint(distilled, tmp_path, capsys):
    from vit.commands import main, run

    classifier = load_classifier(distilled)
    images = random_images(tmp_path, 2, size=(16, 16), name="digit{i}.png")
    main(["predict", "--ckpt", str(distilled), *map(str, images), "--out", str(tmp_path / "p.json")])
    records = json.loads((tmp_path / "p.json").read_text())
    x = torch.stack([classifier.eval_transform()(Image.open(p)) for p in images])
    with torch.no_grad():
        probs = classifier(x).softmax(-1)
    for record, p in zip(records, probs):
        assert record["top_k"][0]["class"] == int(p.argmax()) and math.isclose(
            record["top_k"][0]["probability"], float(p.max()), abs_tol=1e-5)

    main(["export", "--ckpt", str(distilled), "--format", "onnx", "--out", str(tmp_path / "onnx")])
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert np.abs(got - classifier(x).detach().numpy()).max() <= 1e-4

    main(["export", "--ckpt", str(distilled), "--format", "safetensors", "--out", str(tmp_path / "st")])
    config = json.loads((tmp_path / "st" / "config.json").read_text())
    assert "distilled" in config["architecture"]  # timm's deit_*_distilled layout
    hub = timm.create_model(f"local-dir:{tmp_path / 'st'}", pretrained=True).eval()
    assert type(hub).__name__ == "VisionTransformerDistilled"
    with torch.no_grad():
        assert (hub(x) - classifier(x)).abs().max() <= 1e-4

    main(["attention", "--ckpt", str(distilled), str(images[0]), "--out", str(tmp_path / "maps")])
    assert (tmp_path / "maps" / "digit0.png").is_file()

    result = run(["probe", *short_digits_run(tmp_path / "probe")[:2],
                  "--model.class_path=vit.tasks.DistilledClassifier", "--model.init_args.distillation=hard",
                   f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}",
                   f"--model.init_args.pretrained={distilled}", "--data.init_args.num_workers=0",
                   "--cache_dir", str(tmp_path / "cache"), "--C", "1", "--k", "1", "--out", str(tmp_path / "pr.ckpt")])
    probed = load_classifier(result["checkpoint"])
    assert type(probed.model).__name__ == "DistilledVisionTransformer"
    assert result["logistic_val_acc"] > 0.1


def test_a_convnet_teacher_trained_by_vit_is_read_back_with_its_own_normalisation(tmp_path):
    convnet = ImageClassifier(backbone="timm", model="resnet10t", model_kwargs={"channels": [8, 16, 32, 64],
                              "stem_width": 8}, num_classes=10, in_chans=1, img_size=8, class_names=DIGITS,
                              mean=[0.2], std=[0.4])
    t = quick_trainer(tmp_path, max_steps=2)
    t.fit(convnet, loader())
    t.save_checkpoint(tmp_path / "convnet.ckpt")
    assert type(load_classifier(tmp_path / "convnet.ckpt").model).__name__ == "ResNet"
    model = student(teacher=str(tmp_path / "convnet.ckpt"), class_names=DIGITS, mean=[0.5], std=[0.25])
    quick_trainer(tmp_path, max_steps=1).fit(model, loader())
    x = next(iter(loader()))[0]
    with torch.no_grad():  # the student's images, normalised at 0.5/0.25, reach the teacher as 0.2/0.4 ones
        expected = convnet.eval_model.eval()((x * 0.25 + 0.5 - 0.2) / 0.4)
    torch.testing.assert_close(model.teacher(x), expected)
    with pytest.raises(UserValueError, match=r"DeiT's dist token and second head: a ViT \(backbone: vit\)"):
        DistilledClassifier(backbone="timm", model="resnet10t", img_size=8)  # a convnet teaches; it is no student


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_the_teacher_runs_under_the_students_precision(tmp_path, teacher_ckpt, precision):
    outputs, weights = [], []

    class Spy(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            pl_module.teacher.register_forward_hook(lambda module, args, out: outputs.append(out.dtype))
            weights.append(next(pl_module.teacher.network.parameters()).dtype)

    model = student(teacher=str(teacher_ckpt), class_names=DIGITS)
    quick_trainer(tmp_path, max_steps=1, precision=precision, callbacks=[Spy()]).fit(model, loader())
    assert outputs == [torch.bfloat16]  # autocast, or weights cast, as the student's
    assert weights == [torch.bfloat16 if precision == "bf16-true" else torch.float32]
