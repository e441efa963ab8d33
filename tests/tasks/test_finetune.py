"""Fine-tuning strategies: what trains when, across resume and DDP; class weights; balanced accuracy."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import free_port, short_digits_run
from tests.helpers import TINY_DIM, quick_trainer, tiny_classifier
from vit.commands import main
from vit.tasks import ImageClassifier, Optimization, SingleLabelHead
from vit.tasks.finetune import LinearProbe, Partial, Staged

STEPS = 3  # batches per epoch in the in-process runs
BACKBONE = ("patch_embed.", "cls_token", "pos_embed", "blocks.", "norm.")


DEEP = {"depth": 3, "drop_path_rate": 0.1}  # three blocks, for freeze_blocks to cut


def data(n: int = 8 * STEPS) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.arange(n) % 10), batch_size=8)


def fit(model: ImageClassifier, epochs: int, tmp_path, **kwargs) -> Trainer:
    trainer = quick_trainer(tmp_path, max_epochs=epochs, **kwargs)
    trainer.fit(model, data())
    return trainer


def changed(before: dict[str, torch.Tensor], model: ImageClassifier) -> set[str]:
    after = model.model.state_dict()
    return {k for k in before if not torch.equal(before[k], after[k])}


def test_linear_probe_trains_the_head_only(tmp_path):
    model = tiny_classifier(model_kwargs=DEEP, optim=Optimization(lr=0.01), finetune=LinearProbe())
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    fit(model, 2, tmp_path)
    assert changed(before, model) == {"head.weight", "head.bias"}


def test_linear_probe_freezes_clips_norm_pre_and_the_register_tokens_too(tmp_path):
    torch.manual_seed(0)
    model = ImageClassifier(model="vit_digits_patch2_8", finetune=LinearProbe(), optim=Optimization(lr=0.01),
                            model_kwargs={"depth": 1, "embed_dim": TINY_DIM, "num_heads": 2, "pre_norm": True,
                                          "reg_tokens": 2})
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    fit(model, 1, tmp_path)
    assert changed(before, model) == {"head.weight", "head.bias"}


def test_linear_probe_freezes_siglips_attention_pool(tmp_path):
    """Only the head trains in a linear probe: SigLIP's pretrained attention pool (``attn_pool``, which reads the
    blocks' tokens for the head) is backbone too. (0.1 froze a list of modules without it, so the pool trained.)"""
    torch.manual_seed(0)
    shrunk = {"img_size": 8, "patch_size": 2, "in_chans": 1, "depth": 1, "embed_dim": TINY_DIM, "num_heads": 2}
    model = ImageClassifier(model="vit_base_patch16_siglip_224", finetune=LinearProbe(), model_kwargs=shrunk,
                            optim=Optimization(lr=0.01))
    assert model.model.global_pool == "map" and model.model.attn_pool is not None
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    fit(model, 1, tmp_path)
    assert changed(before, model) == {"head.weight", "head.bias"}
    assert not model.model.attn_pool.training  # frozen modules run in eval mode


def test_partial_freezes_the_embedding_and_the_first_blocks(tmp_path):
    model = tiny_classifier(model_kwargs=DEEP, optim=Optimization(lr=0.01), finetune=Partial(freeze_blocks=2))
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    fit(model, 1, tmp_path)
    moved = changed(before, model)
    assert not any(k.startswith(("patch_embed.", "cls_token", "pos_embed", "blocks.0.", "blocks.1.")) for k in moved)
    assert any(k.startswith("blocks.2.") for k in moved) and {"head.weight", "norm.weight"} <= moved


def test_staged_trains_the_head_then_everything_with_a_second_warm_up(tmp_path):
    staged = Optimization(lr=0.01, warmup_steps=2, min_lr=0.0)
    model = tiny_classifier(model_kwargs=DEEP, optim=staged, finetune=Staged(head_epochs=2))
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    lrs = []
    from lightning.pytorch import Callback

    class Record(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            lrs.append({g["name"]: g["lr"] for g in trainer.optimizers[0].param_groups})

    fit(model, 2, tmp_path, callbacks=[Record()])
    assert changed(before, model) <= {"head.weight", "head.bias"}  # two head-only epochs
    assert all(lr["layer4_decay" if "layer4_decay" in lr else "decay"] == 0.0 for lr in lrs)
    model2 = tiny_classifier(model_kwargs=DEEP, optim=staged, finetune=Staged(head_epochs=2))
    lrs.clear()
    fit(model2, 4, tmp_path, callbacks=[Record()])
    assert any(k.startswith("blocks.") for k in changed(before, model2))  # then the backbone trains too
    backbone = [lr["decay"] for lr in lrs]
    head = [lr["head_decay"] for lr in lrs]
    start = 2 * STEPS
    assert backbone[:start] == [0.0] * start and backbone[start] == pytest.approx(head[0])  # its own warm-up
    assert backbone[start + 1] > backbone[start]


def test_bad_strategies_are_clear_errors():
    with pytest.raises(ValueError, match=r"model\.finetune must be one of"):
        tiny_classifier(model_kwargs=DEEP, finetune="adapter")  # ("lora" is one now: tests/tasks/test_adapters.py)
    with pytest.raises(ValueError, match=r"Partial needs 0 < freeze_blocks <= depth \(3\), got 5"):
        tiny_classifier(model_kwargs=DEEP, finetune=Partial(freeze_blocks=5))
    tiny_classifier(model_kwargs=DEEP, finetune=Partial(freeze_blocks=3))  # the boundary: every block
    with pytest.raises(ValueError, match=r"Partial needs 0 < freeze_blocks <= depth \(3\), got 0"):
        tiny_classifier(model_kwargs=DEEP, finetune=Partial(freeze_blocks=0))
    with pytest.raises(ValueError, match="Staged needs head_epochs >= 1, got 0"):
        tiny_classifier(model_kwargs=DEEP, finetune=Staged(head_epochs=0))
    with pytest.raises(ValueError, match="Staged needs head_epochs >= 1"):  # the old spelling: the same check
        tiny_classifier(model_kwargs=DEEP, finetune="staged")


def test_the_parameter_group_table_is_logged_at_fit_start(tmp_path, caplog):
    import logging

    # Lightning's logger stops propagating to the root (where caplog listens) when it was imported before any
    # logging was configured, which depends on test order; listen on it directly.
    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
            probe = tiny_classifier(model_kwargs=DEEP, optim=Optimization(lr=0.01, layer_decay=0.75),
                                    finetune=LinearProbe())
            fit(probe, 1, tmp_path, max_steps=1)
    finally:
        lightning_log.removeHandler(caplog.handler)
    table = caplog.text
    assert "parameter group" in table and "peak lr" in table and "weight decay" in table
    assert "head_decay" in table and "layer1_decay" in table
    head_row = next(line for line in table.splitlines() if line.strip().startswith("head_decay"))
    assert head_row.split()[1] == "320" and head_row.rstrip().endswith("yes")  # 32 x 10 weights, training
    block_row = next(line for line in table.splitlines() if line.strip().startswith("layer1_decay"))
    assert block_row.rstrip().endswith("no")  # frozen by the linear probe


def test_class_weighting_weights_each_class_by_its_rarity(tmp_path):
    from lightning.pytorch import LightningDataModule

    class Imbalanced(LightningDataModule):
        train_set = TensorDataset(torch.randn(30, 1, 8, 8), torch.tensor([0] * 20 + [1] * 10))
        train_set.labels = train_set.tensors[1].tolist()

        def class_counts(self, split):
            return [20, 10]

        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=10)

    model = tiny_classifier(model_kwargs=DEEP, optim=Optimization(lr=0.01), num_classes=2,
                            head=SingleLabelHead(class_weighting=True))
    quick_trainer(tmp_path, max_steps=1).fit(model, datamodule=Imbalanced())
    torch.testing.assert_close(model.train_loss.weight, torch.tensor([30 / 40, 30 / 20]))


def test_balanced_accuracy_is_the_mean_recall(tmp_path):
    from sklearn.metrics import balanced_accuracy_score

    model = tiny_classifier(model_kwargs=DEEP, optim=Optimization(lr=0.01))
    loader = data(40)
    result = fit(model, 1, tmp_path, max_steps=1).test(model, loader, verbose=False)[0]
    with torch.no_grad():
        predicted = torch.cat([model.eval()(x).argmax(-1) for x, _ in loader])
    labels = torch.cat([y for _, y in loader])
    assert result["test_acc_balanced"] == pytest.approx(balanced_accuracy_score(labels, predicted))


@pytest.mark.slow
def test_a_run_killed_in_the_frozen_stage_resumes_with_the_same_groups_and_unfreezes_on_time(tmp_path):
    """Crash in the head-only stage; the resumed run has the straight run's groups, stage and final weights."""
    staged = ["--model.init_args.finetune=vit.tasks.finetune.Staged",
              "--model.init_args.finetune.init_args.head_epochs=2", "--trainer.max_epochs=4",
              "--test_after_fit=false", "--num_threads=1"]
    runs = {}
    for name in ("straight", "resumed"):
        args = [*short_digits_run(tmp_path / name, steps=STEPS), *staged]
        if name == "resumed":
            with pytest.raises(RuntimeError, match="simulated crash"):
                main(["fit", *args, "--trainer.callbacks+=tests.dummies.CrashAtStep",
                      f"--trainer.callbacks.init_args.step={STEPS + 1}"])
            saved = torch.load(tmp_path / name / "ckpt" / "last.ckpt", weights_only=True)
            assert saved["epoch"] == 0  # killed while only the head trained
            groups = saved["optimizer_states"][0]["param_groups"]
            args += ["--ckpt_path", "last"]
        main(["fit", *args])
        runs[name] = torch.load(tmp_path / name / "ckpt" / "last.ckpt", weights_only=True)
    straight, resumed = runs["straight"], runs["resumed"]
    strip = lambda gs: [{k: v for k, v in g.items() if k != "lr"} for g in gs]
    assert strip(groups) == strip(straight["optimizer_states"][0]["param_groups"])  # the same groups throughout
    for key, value in straight["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key  # unfroze at the same epoch, bitwise


# The staged unfreeze under 2-process DDP:
# tests/cli/test_main.py::test_ddp_on_two_cpu_processes_with_ema_through_the_unfreeze


def test_plain_ddp_refuses_a_staged_finetune_and_names_the_strategy_that_runs_it(tmp_path, monkeypatch):
    """The same check on a real DDP model of one rank, in this process (gloo; a 2-process run only to see an
    error cost 15 s): freezing under DDP without find_unused_parameters is refused before the first step."""
    from vit.cli.main import cli
    from vit.errors import UserValueError

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    with pytest.raises(UserValueError, match=r"set trainer\.strategy: ddp_find_unused_parameters_true"):
        cli(["fit", *short_digits_run(tmp_path, steps=2), "--trainer.strategy=ddp", "--trainer.devices=1",
             "--model.init_args.finetune=vit.tasks.finetune.Staged",
             "--model.init_args.finetune.init_args.head_epochs=1", "--test_after_fit=false"])
