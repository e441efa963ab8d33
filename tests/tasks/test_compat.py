"""The classifier's old spellings still work, each with one line naming the new one: fine-tuning as a string with
its settings beside it (``finetune: lora``, ``lora:``, ``freeze_blocks``, ``head_epochs``) and the normalisation as
four arguments (``mean``, ``std``, ``crop_pct``, ``interpolation``); in Python, in a config, on the command line and
in a checkpoint written before the change."""

from __future__ import annotations

import pytest
import torch
import yaml

from tests.conftest import short_digits_run
from tests.helpers import TINY_DIM, tiny_classifier
from tests.tasks.test_adapters import LORA, base_file
from vit.cli.main import cli
from vit.errors import UserValueError
from vit.preprocessing import Preprocessing
from vit.tasks import ImageClassifier, load_task
from vit.tasks.compat import STRATEGIES, strategy_named, upgraded_arguments, upgraded_hparams
from vit.tasks.finetune import Adapters, Full, LinearProbe, Partial, Staged

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args")

# each old spelling -> the strategy it builds (written out by hand: the table under test is not consulted)
OLD = [
    ({"finetune": "full"}, Full()),
    ({"finetune": "linear_probe"}, LinearProbe()),
    ({"finetune": "partial", "freeze_blocks": 1}, Partial(freeze_blocks=1)),
    ({"finetune": "staged", "head_epochs": 2}, Staged(head_epochs=2)),
    ({"finetune": "lora", "lora": LORA, "head_epochs": 1}, Adapters(rank=2, targets=("q", "v", "fc1"), head_epochs=1)),
    ({"finetune": "dora", "lora": {"rank": 3}}, Adapters(rank=3, dora=True)),
]


def strategy_fields(strategy) -> tuple:
    import dataclasses

    return type(strategy), {f.name: getattr(strategy, f.name) for f in dataclasses.fields(strategy)}


@pytest.mark.parametrize(("old", "new"), OLD, ids=[o["finetune"] for o, _ in OLD])
def test_each_old_finetune_string_builds_its_strategy_with_one_line_naming_the_new_spelling(old, new):
    with pytest.warns(FutureWarning, match=rf"finetune: {old['finetune']}.* is written finetune: \{{class_path: "
                                           rf"vit\.tasks\.finetune\.{type(new).__name__}") as caught:
        model = tiny_classifier(**old)
    assert len([w for w in caught if issubclass(w.category, FutureWarning)]) == 1
    assert strategy_fields(model.finetune) == strategy_fields(new)
    saved = model.hparams["finetune"]  # the checkpoint keeps the new spelling, and none of the old keys
    assert saved["class_path"] == f"vit.tasks.finetune.{type(new).__name__}"
    assert not {"freeze_blocks", "head_epochs", "lora"} & set(model.hparams)


def test_the_old_strings_are_the_ones_0_1_took():
    assert set(STRATEGIES) == {"full", "linear_probe", "partial", "staged", "lora", "dora"}
    with pytest.raises(UserValueError, match=r"model\.finetune must be one of full, linear_probe"):
        strategy_named("adapter")
    with pytest.raises(UserValueError, match=r"model\.lora sets adapters, which finetune: staged does not train"):
        strategy_named("staged", {"lora": LORA, "head_epochs": 1})


def test_old_settings_beside_a_new_strategy_go_into_it():
    """A second config (or the command line) that gives an old key alone adds it to the strategy the first named."""
    args, notes = upgraded_arguments({"finetune": {"class_path": "vit.tasks.finetune.Staged"}, "head_epochs": 3})
    assert args == {"finetune": {"class_path": "vit.tasks.finetune.Staged", "init_args": {"head_epochs": 3}}}
    assert len(notes) == 1 and "head_epochs" in notes[0]
    args, _ = upgraded_arguments({"lora": {"rank": 4}})  # no strategy named here: onto the one given elsewhere
    assert args == {"finetune": {"init_args": {"rank": 4}}}
    assert upgraded_arguments({"finetune": {"class_path": "x.Y"}, "head_epochs": 0}) == (
        {"finetune": {"class_path": "x.Y"}}, [])  # 0.1's defaults said nothing: dropped without a word


def test_old_normalisation_keys_make_the_record():
    with pytest.warns(FutureWarning, match=r"model.init_args.\{mean, std, crop_pct, interpolation\} are written "
                                           "preprocessing"):
        model = tiny_classifier(mean=[0.25], std=[0.5], crop_pct=0.9, interpolation="bilinear")
    assert model.preprocessing == Preprocessing((0.25,), (0.5,), 0.9, "bilinear")
    assert model.checkpoint_meta()["crop_pct"] == 0.9 and "mean" not in model.hparams
    with pytest.warns(FutureWarning):  # only mean: the rest from the defaults of the channel count
        assert tiny_classifier(mean=[0.25]).preprocessing == Preprocessing((0.25,), (0.5,), 1.0, "bicubic")
    # given beside the record (the CLI links both): the record wins, as the data's link did
    given = Preprocessing((0.1,), (0.2,), 0.8, "bicubic")
    assert tiny_classifier(preprocessing=given, mean=[0.7]).preprocessing == given


def test_an_argument_no_version_took_is_a_type_error_naming_where_0_1_s_went():
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['lr'\] \(lr moved to optim.lr\)"):
        tiny_classifier(lr=0.1)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['nonsense'\]"):
        tiny_classifier(nonsense=1)


def test_a_config_with_the_old_keys_runs_and_says_the_new_spelling(tmp_path):
    config = tmp_path / "old.yaml"
    config.write_text(yaml.safe_dump({"model": {"init_args": {
        "finetune": "staged", "head_epochs": 1, "pretrained": None}}}))
    with pytest.warns(FutureWarning, match=r"finetune: staged \(with head_epochs\) is written finetune: \{class_path: "
                                           r"vit.tasks.finetune.Staged, init_args: \{head_epochs: 1\}\}"):
        run = cli(["fit", *short_digits_run(tmp_path, "--config", str(config), steps=2), "--test_after_fit=false"])
    assert strategy_fields(run.model.finetune) == strategy_fields(Staged(head_epochs=1))
    written = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())  # the run's config: the new spelling
    assert written["model"]["init_args"]["finetune"]["class_path"] == "vit.tasks.finetune.Staged"


def test_old_keys_on_the_command_line_run(tmp_path):
    base = base_file(tmp_path)
    with pytest.warns(FutureWarning, match="finetune: dora"):
        run = cli(["fit", *short_digits_run(tmp_path, steps=2), "--test_after_fit=false",
                   f"--model.init_args.model_kwargs={{depth: 2, embed_dim: {TINY_DIM}, num_heads: 2}}",
                   "--model.init_args.model=vit_digits_patch2_8", "--data.init_args.img_size=8",
                   f"--model.init_args.pretrained={base}", "--model.init_args.finetune=dora",
                   "--model.init_args.lora={rank: 2, targets: [q, v]}", "--model.init_args.head_epochs=1",
                   "--model.init_args.lora.alpha=4.0", "--trainer.strategy=ddp_find_unused_parameters_true",
                   "--trainer.devices=1"])
    assert strategy_fields(run.model.finetune) == strategy_fields(
        Adapters(rank=2, alpha=4.0, targets=("q", "v"), dora=True, head_epochs=1))


def as_written_before(path, old: dict) -> None:
    """The checkpoint ``path`` as the classifier wrote it before fine-tuning was a part: its hyperparameters with
    the old keys ``old`` in place of ``finetune`` and ``preprocessing``."""
    checkpoint = torch.load(path, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    record = hparams.pop("preprocessing") or {}
    hparams.pop("finetune")
    hparams.update({"freeze_blocks": 0, "head_epochs": 0, "lora": None, "mean": None, "std": None, "crop_pct": 1.0,
                    "interpolation": "bicubic", **{k: list(v) if isinstance(v, tuple) else v
                                                   for k, v in record.items()}, **old})
    torch.save(checkpoint, path)


def test_a_thin_lora_checkpoint_written_before_loads_and_resumes(tmp_path):
    from tests.tasks.test_adapters import X, fitted

    model, path = fitted(tmp_path)
    as_written_before(path, {"finetune": "lora", "lora": LORA})
    hparams = torch.load(path, weights_only=True)["hyper_parameters"]
    assert hparams["finetune"] == "lora" and "preprocessing" not in hparams
    upgraded = upgraded_hparams(hparams, {})
    assert upgraded["finetune"] == {"class_path": "vit.tasks.finetune.Adapters",
                                    "init_args": {"head_epochs": 0, **LORA}}
    with torch.no_grad():
        again = load_task(path, ImageClassifier)  # the base found, the state completed (nothing to respell: quiet)
        assert torch.equal(again(X), model(X))
    with pytest.warns(FutureWarning, match="finetune: lora"):
        resumed = ImageClassifier.load_from_checkpoint(path)  # Lightning's own way: the old keys as arguments
    assert strategy_fields(resumed.finetune) == strategy_fields(Adapters(rank=2, targets=("q", "v", "fc1")))


def test_resuming_a_checkpoint_written_before_with_the_cli(tmp_path):
    """``vit fit --ckpt_path`` reads the checkpoint's hyperparameters into the config: the old keys among them."""
    args = [*short_digits_run(tmp_path, steps=2), "--test_after_fit=false"]
    cli(["fit", *args, "--model.init_args.finetune=vit.tasks.finetune.Partial",
         "--model.init_args.finetune.init_args.freeze_blocks=1"])
    last = next(tmp_path.rglob("last.ckpt"))
    as_written_before(last, {"finetune": "partial", "freeze_blocks": 1})
    with pytest.warns(FutureWarning, match="finetune: partial"):
        run = cli(["fit", *args, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert strategy_fields(run.model.finetune) == strategy_fields(Partial(freeze_blocks=1))
    assert run.trainer.current_epoch == 2
