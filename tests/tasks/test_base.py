"""What the tasks share (`vit.tasks.base`): the warm-up + cosine schedule of MAE step by step, and the lr scaled
to the global batch with gradient accumulation, for the classifier and MAE. Expected values are hand formulas."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import quick_trainer, tiny_classifier, tiny_mae
from vit.errors import UserValueError
from vit.tasks import Optimization
from vit.tasks.base import BaseTask, as_config, from_config
from vit.tasks.finetune import FineTuning, Full, Staged


def images(n: int = 24, batch: int = 8) -> DataLoader:
    x = torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, torch.arange(n) % 10), batch_size=batch)


class RecordLr(Callback):
    """Every group's lr as each optimiser step starts."""

    def __init__(self) -> None:
        self.lrs: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append([g["lr"] for g in trainer.optimizers[0].param_groups])


def test_mae_warms_up_for_warmup_epochs_then_decays_by_cosine_at_every_step(tmp_path):
    # 3 batches an epoch, 3 epochs: 9 steps, the first epoch (3 steps) warm-up
    record = RecordLr()
    mae = tiny_mae(lr=0.01, warmup_epochs=1, min_lr=0.0)
    quick_trainer(tmp_path, max_epochs=3, callbacks=[record]).fit(mae, images())
    hand = [0.01 * (s + 1) / 3 if s < 3 else 0.01 * 0.5 * (1 + math.cos(math.pi * (s - 3) / 6)) for s in range(9)]
    assert len(record.lrs) == 9
    for step, groups in enumerate(record.lrs):
        assert groups == pytest.approx([hand[step]] * 2, rel=1e-9), step  # decay and no_decay alike
    assert [g[0] for g in record.lrs[:4]] == pytest.approx([0.01 / 3, 0.02 / 3, 0.01, 0.01])


def test_mae_decays_no_token_the_encoder_has_registers_included(tmp_path):
    """MAE asks the networks which parameters are tokens (`param_roles`): the encoder's cls and register tokens and
    the decoder's mask token take no weight decay. (0.1's MAE kept a list of its own without ``reg_token``, so
    register tokens were decayed in pre-training.)"""
    mae = tiny_mae(model_kwargs={"reg_tokens": 2})
    quick_trainer(tmp_path, max_steps=1).fit(mae, images())
    groups = mae.trainer.optimizers[0].param_groups
    decay = {g["name"]: {id(p) for p in g["params"]} for g in groups}
    assert [g["name"] for g in groups] == ["decay", "no_decay"] and groups[1]["weight_decay"] == 0.0
    for token in (mae.model.reg_token, mae.model.cls_token, mae.decoder.mask_token):
        assert id(token) in decay["no_decay"]
    assert all(id(mae.model.pos_embed) not in ids for ids in decay.values())  # fixed sin-cos: not optimised
    assert all(p.ndim > 1 for g in groups if g["name"] == "decay" for p in g["params"])


def test_the_lr_scales_to_the_global_batch_with_gradient_accumulation(tmp_path):
    # 8 images a batch x 1 process x 2 accumulated = 16 images an optimiser step
    classifier = tiny_classifier(optim=Optimization(lr=0.01, lr_base_batch=4))
    quick_trainer(tmp_path, max_steps=1, accumulate_grad_batches=2).fit(classifier, images())
    assert classifier.trainer.optimizers[0].param_groups[-1]["initial_lr"] == pytest.approx(0.01 * 16 / 4)
    mae = tiny_mae(blr=1e-3)
    quick_trainer(tmp_path, max_steps=1, accumulate_grad_batches=2).fit(mae, images())
    assert mae.trainer.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(1e-3 * 16 / 256)


def test_a_checkpoint_of_another_vit_is_refused_before_any_weight_is_copied():
    ten, three = tiny_classifier(num_classes=10), tiny_classifier(num_classes=3)
    three.on_load_checkpoint({"vit": three.checkpoint_meta()})  # its own: fine
    with pytest.raises(ValueError, match=r"written for vit_digits_patch2_8 with 10 classes, this run builds vit_digits_"
                                         r"patch2_8 with 3 classes; they differ in num_classes: checkpoint 10"):
        three.on_load_checkpoint({"vit": ten.checkpoint_meta()})
    deeper = tiny_mae(model_kwargs={"depth": 3})
    with pytest.raises(ValueError, match=r"written for vit_digits_patch2_8, this run builds vit_digits_patch2_8; "
                                         r"they differ in depth: checkpoint 3, this model 2"):
        tiny_mae().on_load_checkpoint({"vit": deeper.checkpoint_meta()})
    with pytest.raises(ValueError, match=r"the checkpoint holds the ImageClassifier task \('classify'\), but the "
                                         r"MaskedAutoencoder task \('pretrain'\) is needed here"):
        tiny_mae().on_load_checkpoint({"vit": ten.checkpoint_meta()})


@pytest.mark.parametrize(("min_lr", "lr", "ratio"), [(1e-5, 1e-3, 0.01), (1e-3, 1e-3, 1.0), (2e-3, 1e-3, 1.0),
                                                      (0.0, 1e-3, 0.0), (1e-5, 0.0, 0.0)])
def test_min_lr_ratio_is_the_floor_over_the_peak_at_most_one(min_lr, lr, ratio):
    assert BaseTask.min_lr_ratio(min_lr, lr) == pytest.approx(ratio)


def test_a_part_picked_by_class_round_trips_through_its_config():
    written = as_config(Staged(head_epochs=2))
    assert written == {"class_path": "vit.tasks.finetune.Staged", "init_args": {"head_epochs": 2}}
    assert from_config(written, FineTuning, Full()) == Staged(head_epochs=2)
    assert from_config(None, FineTuning, Full()) == Full() and as_config(3) == 3
    with pytest.raises(UserValueError, match=r"is not a vit\.tasks\.finetune\.FineTuning"):
        from_config({"class_path": "vit.tasks.heads.SingleLabelHead"}, FineTuning, Full())
