"""finetune: lora | dora in the classification task: what trains, step 0, checkpoints that hold what trains and
name their base, exact resume, EMA, staged, DDP, bf16 and gradient checkpointing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import vit
from tests.conftest import free_port, short_digits_run
from tests.helpers import DIGITS_VIT, TINY, TINY_DIM, quick_trainer, tiny_classifier
from tests.nn.test_vision import perturb
from tests.tasks.test_finetune import data
from vit.cli.main import cli
from vit.commands import main
from vit.deploy.classifier import read_classifier
from vit.errors import UserPathError, UserValueError
from vit.nn.blocks import EncoderBlock
from vit.nn.lora import LoraLinear, is_adapter
from vit.tasks import ImageClassifier
from vit.tasks.finetune import Adapters, Full

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:LightningCLI's args")]
LORA = {"rank": 2, "targets": ["q", "v", "fc1"]}
X = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(5))


def base_file(folder: Path, name: str = DIGITS_VIT, **options) -> Path:
    """A 'pretrained' base: the model with weights moved off their init, saved as timm-layout safetensors."""
    model = perturb(vit.create_model(name, **{**TINY, **options}))
    path = folder / "base.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def adapters(finetune: str = "lora", lora: dict | None = None, head_epochs: int = 0) -> Adapters:
    """The strategy of LoRA (or DoRA) with these settings (``LORA`` by default)."""
    return Adapters(**(LORA if lora is None else lora), dora=finetune == "dora", head_epochs=head_epochs)


def lora_classifier(base: Path, finetune: str = "lora", **kwargs) -> ImageClassifier:
    strategy = adapters(finetune, kwargs.pop("lora", None), kwargs.pop("head_epochs", 0))
    model = tiny_classifier(finetune=strategy, pretrained=str(base), **kwargs)
    model.configure_model()
    return model


@pytest.mark.parametrize("finetune", ["lora", "dora"])
def test_step0_is_the_base_and_only_adapters_and_head_train(tmp_path, finetune):
    base = base_file(tmp_path)
    plain = vit.create_model(DIGITS_VIT, **TINY).eval()
    vit.load_pretrained(plain, base)  # the base, loaded on its own
    model = lora_classifier(base, finetune).eval()
    with torch.no_grad():
        assert torch.equal(model(X), plain(X))  # the same logits, bit for bit (the base's head fits 10 classes)
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    quick_trainer(tmp_path, max_epochs=1).fit(model, data())
    after = model.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(is_adapter(k) or k.startswith("head.") for k in moved)
    assert any(".lora_B." in k for k in moved) and {"head.weight", "head.bias"} <= moved
    optimised = {id(p) for g in model.trainer.optimizers[0].param_groups for p in g["params"]}
    assert optimised == {id(p) for n, p in model.model.named_parameters() if is_adapter(n) or n.startswith("head.")}


def test_norms_and_tokens_train_when_asked(tmp_path):
    model = lora_classifier(base_file(tmp_path), lora={**LORA, "train_norms": True, "train_tokens": True})
    trains = {n for n, p in model.model.named_parameters() if p.requires_grad}
    assert {"blocks.0.norm1.weight", "norm.bias", "cls_token", "pos_embed"} <= trains
    assert "blocks.0.attn.qkv.weight" not in trains
    plain = lora_classifier(base_file(tmp_path))
    trains = {n for n, p in plain.model.named_parameters() if p.requires_grad}
    assert not {"blocks.0.norm1.weight", "cls_token"} & trains


def fitted(tmp_path: Path, finetune: str = "lora", **kwargs) -> tuple[ImageClassifier, Path]:
    model = lora_classifier(base_file(tmp_path), finetune, optim={"ema_decay": 0.9}, **kwargs)
    trainer = quick_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, data())
    trainer.save_checkpoint(tmp_path / "lora.ckpt")
    return model.eval(), tmp_path / "lora.ckpt"


@pytest.mark.parametrize("finetune", ["lora", "dora"])
def test_the_checkpoint_holds_what_trains_and_loads_merged(tmp_path, finetune):
    model, path = fitted(tmp_path, finetune)
    saved = torch.load(path, weights_only=True)
    held = {k.split(".", 1)[1].replace("module.", "", 1) for k in saved["state_dict"]}
    assert held == {n for n, _ in model.model.named_parameters() if is_adapter(n) or n.startswith("head.")}
    base = saved["vit"]["lora"]["base"]
    assert base["path"] == str((tmp_path / "base.safetensors").resolve()) and len(base["sha256"]) == 64
    with torch.no_grad():
        want = model(X)
        classifier = read_classifier(path)  # without Lightning: the base found, the adapters merged
        assert not any(isinstance(m, LoraLinear) for m in classifier.model.modules())
        torch.testing.assert_close(classifier(X), want, rtol=1e-5, atol=1e-5)
        again = ImageClassifier.load_from_checkpoint(path).eval()  # the task: base loaded, state completed
        assert torch.equal(again(X), want)


def test_a_changed_or_missing_base_is_refused_with_its_name_and_hash(tmp_path):
    _, path = fitted(tmp_path)
    sha = torch.load(path, weights_only=True)["vit"]["lora"]["base"]["sha256"]
    other = perturb(vit.create_model(DIGITS_VIT, **TINY), scale=0.07)
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, tmp_path / "base.safetensors")
    with pytest.raises(UserValueError, match=rf"trained on the file .*base.safetensors.*{sha[:16]}.*other weights"):
        read_classifier(path)
    with pytest.raises(UserValueError, match="holds other weights"):
        ImageClassifier.load_from_checkpoint(path)
    (tmp_path / "base.safetensors").unlink()
    with pytest.raises(UserPathError, match=rf"base.safetensors.*sha256 {sha[:16]}.*save_base"):
        read_classifier(path)


def test_save_base_holds_everything_and_needs_no_base_file(tmp_path):
    model, path = fitted(tmp_path, lora={**LORA, "save_base": True})
    saved = torch.load(path, weights_only=True)
    assert saved["vit"]["lora"]["base"] is None and "model.blocks.0.attn.qkv.weight" in saved["state_dict"]
    (tmp_path / "base.safetensors").unlink()
    with torch.no_grad():
        torch.testing.assert_close(read_classifier(path)(X), model(X), rtol=1e-5, atol=1e-5)


def test_the_ema_averages_the_adapters_and_shares_the_base(tmp_path):
    model, _ = fitted(tmp_path)
    ema, own = dict(model.model_ema.module.named_parameters()), dict(model.model.named_parameters())
    assert ema["blocks.0.attn.qkv.weight"] is own["blocks.0.attn.qkv.weight"]  # one backbone in memory
    name = "blocks.0.attn.qkv.lora_B.q"
    assert ema[name] is not own[name] and not torch.equal(ema[name], own[name])  # averaged, behind


def test_staged_trains_the_head_first_then_the_adapters(tmp_path):
    model = lora_classifier(base_file(tmp_path), head_epochs=1)
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    quick_trainer(tmp_path, max_epochs=1).fit(model, data())
    moved = {k for k, v in model.model.state_dict().items() if not torch.equal(before[k], v)}
    assert moved == {"head.weight", "head.bias"}
    quick_trainer(tmp_path, max_epochs=2).fit(model, data())
    assert any(".lora_B." in k for k, v in model.model.state_dict().items() if not torch.equal(before[k], v))


def test_bf16_and_gradient_checkpointing_train_the_adapters(tmp_path):
    model = lora_classifier(base_file(tmp_path), "dora", grad_checkpointing=True)
    quick_trainer(tmp_path, max_steps=2, precision="bf16-mixed").fit(model, data())
    b = model.model.blocks[0].attn.qkv.lora_B["q"]
    assert b.dtype == torch.float32 and torch.isfinite(b).all() and b.abs().sum() > 0


def test_wrong_settings_are_clear_errors(tmp_path):
    with pytest.raises(UserValueError, match="finetune: full does not train"):  # the old spelling's settings
        tiny_classifier(finetune="full", lora=LORA)
    with pytest.raises(TypeError, match="rank"):  # the new spelling: Full takes no adapter settings
        tiny_classifier(finetune={"class_path": "vit.tasks.finetune.Full", "init_args": {"rank": 2}})
    assert isinstance(tiny_classifier(finetune=Full()).finetune, Full)
    with pytest.raises(UserValueError, match="adapts our ViTs"):
        ImageClassifier(model="resnet10t", backbone="timm", img_size=32, finetune=Adapters())
    with pytest.raises(UserValueError, match="some of"):
        Adapters(targets=["query"])


def test_plain_ddp_runs_lora_but_not_staged_lora(tmp_path, monkeypatch):
    """The frozen base never asks for gradients: plain DDP (no find_unused_parameters) runs LoRA; the head-only
    epochs of a staged LoRA leave the adapters unused, which plain DDP refuses up front."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    args = [*short_digits_run(tmp_path, steps=2), "--trainer.strategy=ddp", "--trainer.devices=1",
            "--model.init_args.finetune=vit.tasks.finetune.Adapters", "--test_after_fit=false"]
    run = cli(["fit", *args])
    assert run.trainer.global_step == 2
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    with pytest.raises(UserValueError, match="ddp_find_unused_parameters_true"):
        cli(["fit", *args, "--model.init_args.finetune.init_args.head_epochs=1"])


def fsdp_strategy(**kwargs):
    """Lightning's FSDPStrategy on CPU ranks. Lightning 2.6 refuses accelerator="cpu" for FSDPStrategy (its check
    is by exact type: a subclass passes) and hands FSDP device_id=None, which torch 2.14 refuses without an
    accelerator; so this wraps as the strategy would, with device_id=cpu, and the strategy does the rest."""
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    class CpuFSDP(FSDPStrategy):
        def _setup_model(self, model):
            policy = self.kwargs.pop("auto_wrap_policy", None)
            return super()._setup_model(FullyShardedDataParallel(
                model, sharding_strategy=self.sharding_strategy, auto_wrap_policy=policy,
                device_id=torch.device("cpu"), **self.kwargs))

        def optimizer_state(self, optimizer):
            """Lightning's full optimiser state without offload_to_cpu: torch 2.14's FSDP gathers each state (exp_avg,
            then exp_avg_sq) into one reused buffer and offloads views of it with ``.cpu()``, which copies on a GPU and
            is the tensor itself on CPU ranks, so every exp_avg came back as its exp_avg_sq. Unoffloaded, it clones."""
            from torch.distributed.fsdp import (
                FullOptimStateDictConfig,
                FullStateDictConfig,
                OptimStateKeyType,
                StateDictType,
            )

            optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer's own
            with FullyShardedDataParallel.state_dict_type(
                    self.model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True),
                    FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True)):
                state = FullyShardedDataParallel.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # by parameter number, as Lightning stores it
                state = FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state

    # every block its own shard unit and checkpointed, as configs/finetune/mae_imagenet_vit_large_fsdp.yaml
    return CpuFSDP(auto_wrap_policy={EncoderBlock}, activation_checkpointing_policy={EncoderBlock}, **kwargs)


def fsdp_rank(rank: int, port: int, out: str, finetune: str) -> None:
    """One of two CPU ranks (gloo, forked): a LoRA or DoRA fit of two epochs (2 steps each) under FSDP, a checkpoint
    each epoch, then the same fit resumed from the first epoch's; the gathered state of each network at its end
    (rank 0 writes the files)."""
    import os
    import warnings

    from lightning.pytorch.callbacks import ModelCheckpoint

    warnings.simplefilter("ignore")  # FSDP's and Lightning's notes on a CPU run
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")  # Lightning then joins these ranks, launches none
    full = {}
    for name, resume in (("straight", None), ("resumed", Path(out, "ck", "epoch=0.ckpt"))):
        model = lora_classifier(Path(out, "base.safetensors"), finetune)
        every_epoch = ModelCheckpoint(Path(out, name if resume else "ck"), "{epoch}", save_top_k=-1)
        # by epochs, with a val loader, as a `vit fit` run: Lightning 2.6 resumes a max_steps run's sampler at the
        # wrong epoch, and one whose checkpoint was saved without a val loop one batch into the epoch it finished
        trainer = quick_trainer(Path(out), max_epochs=2, devices=2, strategy=fsdp_strategy(),
                                enable_checkpointing=True, callbacks=[every_epoch])
        trainer.fit(model, data(), data(8), ckpt_path=resume)
        full[name] = trainer.strategy.lightning_module_state_dict()  # every rank takes part; rank 0 gets it whole
    if rank == 0:
        torch.save(full, Path(out, "full.pt"))


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "dora"])
def test_fsdp_trains_the_adapters_and_saves_a_thin_checkpoint_that_loads_merged(tmp_path, finetune):
    """Lightning's FSDPStrategy on 2 CPU ranks, each block a shard unit: the adapters and head train, the base does
    not move, the checkpoints hold what trained, the ranks resume from the first epoch's (the base loaded before the
    wrap) to the straight run's weights bit for bit, and one process loads the last, merged, as the ranks left it."""
    import torch.multiprocessing as mp

    base = base_file(tmp_path)
    start = lora_classifier(base, finetune).model.state_dict()  # what each rank starts from (seeded)
    mp.start_processes(fsdp_rank, args=(free_port(), str(tmp_path), finetune), nprocs=2, start_method="fork")
    runs = torch.load(tmp_path / "full.pt")
    assert runs["resumed"].keys() == runs["straight"].keys()
    assert all(torch.equal(v, runs["straight"][k]) for k, v in runs["resumed"].items())  # the resume: bitwise
    full = {k.removeprefix("model."): v for k, v in runs["straight"].items() if k.startswith("model.")}
    trained = {n for n in start if is_adapter(n) or n.startswith("head.")}
    assert full.keys() == start.keys()
    assert {n for n in start if not torch.equal(start[n], full[n])} == trained  # the base frozen, all else moved
    ckpt = tmp_path / "ck" / "epoch=1.ckpt"  # the last: the straight run's final weights
    saved = torch.load(ckpt, weights_only=True)
    assert saved["state_dict"].keys() == {"model." + n for n in trained}  # thin: no base weights
    assert all(torch.equal(v, full[k.removeprefix("model.")]) for k, v in saved["state_dict"].items())
    assert len(saved["optimizer_states"][0]["state"]) == len(trained)
    reference = lora_classifier(base, finetune).eval()
    reference.model.load_state_dict(full)
    with torch.no_grad():
        want = reference(X)
        merged = read_classifier(ckpt)  # one process: the base found, the adapters merged
        assert not any(isinstance(m, LoraLinear) for m in merged.model.modules())
        torch.testing.assert_close(merged(X), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(ImageClassifier.load_from_checkpoint(ckpt).eval()(X), want)


def test_fsdp_without_use_orig_params_is_a_clear_error(tmp_path):
    """torch's FSDP cannot shard a block that mixes frozen and trained parameters without use_orig_params (Lightning's
    default): said before it wraps, in a line naming the setting."""
    model = lora_classifier(base_file(tmp_path))
    model.trainer = quick_trainer(tmp_path, max_steps=1, strategy=fsdp_strategy(use_orig_params=False))
    with pytest.raises(UserValueError, match=r"finetune: Adapters \(LoRA\) .* use_orig_params: false"):
        model.setup("fit")  # Lightning's setup hook: before the strategy wraps the model
    model.trainer = quick_trainer(tmp_path, max_steps=1, strategy=fsdp_strategy())
    model.setup("fit")  # Lightning 2.6's default, use_orig_params=True, passes


def test_a_thin_state_dict_loads_strictly_once_its_base_is_in(tmp_path):
    """FSDP loads a checkpoint's state dict itself, after sharding and before on_load_checkpoint could complete a
    thin one: a strict load forgives the missing base once the base is in (loaded before the wrap), never a
    missing adapter, and says what to do when the base is not in. `vit fit --ckpt_path` keeps the base the
    checkpoint names as pretrained (`base_to_resume`)."""
    from vit.checkpoints.lora import base_to_resume

    model, path = fitted(tmp_path)
    thin = torch.load(path, weights_only=True)["state_dict"]
    assert base_to_resume(path) == str(tmp_path / "base.safetensors")
    resumed = lora_classifier(tmp_path / "base.safetensors", optim={"ema_decay": 0.9})
    resumed.load_state_dict(thin)  # strict: the base left out, the base in
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in resumed.state_dict().items())
    adapter = next(k for k in thin if ".lora_B." in k)
    with pytest.raises(RuntimeError, match=rf"Missing key.*{adapter}"):
        resumed.load_state_dict({k: v for k, v in thin.items() if k != adapter})
    bare = tiny_classifier(finetune=adapters(), optim={"ema_decay": 0.9})  # no pretrained: no base in
    with pytest.raises(UserValueError, match=r"adapters alone, and their base was not loaded .* set model"):
        bare.load_state_dict(thin)
    (tmp_path / "base.safetensors").unlink()
    assert base_to_resume(path) is None  # the base is gone: the resume says so as it loads (`load_base`)


@pytest.mark.parametrize("thin", [True, False])
def test_resuming_a_sharded_folder_of_adapters_alone_is_a_clear_error(tmp_path, thin):
    """torch's distributed checkpoint loads every key the model has or fails: a sharded folder (FSDP's
    state_dict_type: sharded) of adapters alone cannot resume, and says what can; one that holds its base can."""
    from vit.checkpoints.lora import base_to_resume

    base = {"source": "base.safetensors", "path": str(tmp_path / "base.safetensors"), "sha256": "0" * 64}
    torch.save({"vit": {"lora": {"rank": 2, "base": base if thin else None}}}, tmp_path / "meta.pt")
    (tmp_path / ".metadata").write_bytes(b"")  # with meta.pt, what makes a folder a sharded checkpoint
    if thin:
        with pytest.raises(UserValueError, match=r"adapters without their base in shards.*state_dict_type: full"):
            base_to_resume(tmp_path)
    else:
        assert base_to_resume(tmp_path) is None  # nothing to load first: the checkpoint holds the base


@pytest.mark.parametrize("ema", [None, 0.99])
def test_an_ema_under_fsdp_is_a_clear_error(tmp_path, ema):
    model = lora_classifier(base_file(tmp_path), optim={"ema_decay": ema})
    model.trainer = quick_trainer(tmp_path, max_steps=1, strategy=fsdp_strategy())
    if ema is None:
        model.setup("fit")
    else:
        with pytest.raises(UserValueError, match=r"optim.ema_decay .* drop ema_decay under FSDP"):
            model.setup("fit")


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "dora"])
def test_a_lora_run_killed_mid_epoch_resumes_bitwise(tmp_path, finetune):
    """configs/shards_cpu.yaml at reduced size (the recipe whose loader resumes mid-epoch: tests/data/test_stream.py),
    3 epochs of 6 steps, last.ckpt every 3 steps, a crash at step 4: resumed from the thin checkpoint of step 3
    (adapters, head, their EMA and optimiser state; `--ckpt_path` sets pretrained to the base file it records, so the
    base loads before the checkpoint, as FSDP needs), the run ends with the straight run's weights and optimiser
    state, bit for bit."""
    from tests.data.test_stream import _assert_same_end, _shards_fit
    from tests.formats import write_class_folders
    from vit.data.shards import write_shards

    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=30, size=20)
    write_shards(tmp_path / "photos", tmp_path / "shards", num_workers=1)  # 48 train: 6 batches of 8 an epoch
    base = base_file(tmp_path, "vit_scratch_patch8_32", depth=1, embed_dim=TINY_DIM, num_heads=2)
    lora = [f"--model.init_args.pretrained={base}", "--model.init_args.finetune={class_path: vit.tasks.finetune."
            f"Adapters, init_args: {{rank: 2, targets: [q, v, fc2], dora: {str(finetune == 'dora').lower()}}}}}"]
    cli(_shards_fit(tmp_path, "straight", *lora, workers=0))
    with pytest.raises(RuntimeError, match="simulated crash at step 4"):
        main(_shards_fit(tmp_path, "crashed", *lora, "--trainer.callbacks+=tests.dummies.CrashAtStep",
                         "--trainer.callbacks.init_args.step=4", workers=0))
    saved = torch.load(tmp_path / "crashed/ckpt/last.ckpt", weights_only=True)
    assert saved["global_step"] == 3 and not any(k.endswith("qkv.weight") for k in saved["state_dict"])
    run = cli(_shards_fit(tmp_path, "crashed", *lora, "--ckpt_path=last", workers=0))
    assert run.trainer.global_step == 18 and run.model.hparams.pretrained == str(base)
    straight = torch.load(tmp_path / "straight/ckpt/last.ckpt", weights_only=False)
    _assert_same_end(straight, torch.load(tmp_path / "crashed/ckpt/last.ckpt", weights_only=False))


def test_without_pretrained_the_task_finds_the_base_the_checkpoint_names(tmp_path):
    """As a resumed `vit fit --ckpt_path` (which drops pretrained) loads it: the base from the checkpoint's own record,
    checked by hash, and named again in the next checkpoint; gone, a message names it."""
    model, path = fitted(tmp_path)
    again = ImageClassifier.load_from_checkpoint(path, pretrained=None).eval()
    with torch.no_grad():
        assert torch.equal(again(X), model(X))
    assert again.checkpoint_meta()["lora"]["base"] == torch.load(path, weights_only=True)["vit"]["lora"]["base"]
    (tmp_path / "base.safetensors").unlink()
    with pytest.raises(UserPathError, match=r"the checkpoint holds LoRA adapters on the file .*base.safetensors"):
        ImageClassifier.load_from_checkpoint(path, pretrained=None)
