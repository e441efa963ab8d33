"""Big ViTs: grad checkpointing in the classifier, the FSDP recipe's strategy, layer-decay groups under real FSDP
shards, and sharded checkpoints consolidated in one process (`vit export --format ckpt`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests import CONFIGS
from tests.conftest import free_port
from tests.helpers import tiny_classifier
from vit.checkpoints.io import DamagedCheckpointError, is_intact, read_checkpoint
from vit.deploy import load_classifier
from vit.nn.blocks import EncoderBlock
from vit.tasks.optim import Optimization, describe_param_groups, network_group_table, param_groups

FSDP_RECIPE = CONFIGS / "finetune" / "mae_imagenet_vit_large_fsdp.yaml"


def test_classifier_grad_checkpointing_gives_the_plain_loss_and_gradients():
    torch.manual_seed(0)
    plain = tiny_classifier(optim=Optimization(layer_decay=0.75))
    checkpointed = tiny_classifier(optim=Optimization(layer_decay=0.75), grad_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    assert checkpointed.model.grad_checkpointing and not plain.model.grad_checkpointing
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    for task in (plain, checkpointed):
        task.train_loss(task.model(x), y).backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


def test_the_fsdp_recipe_builds_lightnings_fsdp_strategy_as_written():
    """The strategy section as LightningCLI parses it (jsonargparse): every block a shard unit and a checkpointed
    unit, parameters kept (use_orig_params), sharded checkpoints; bf16-mixed on GPUs across nodes."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy, Strategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    config = yaml.safe_load(FSDP_RECIPE.read_text())
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(Strategy, "strategy")
    strategy = parser.instantiate(parser.parse_object({"strategy": config["trainer"]["strategy"]})).strategy
    assert isinstance(strategy, FSDPStrategy) and strategy.kwargs["use_orig_params"] is True
    for policy in (strategy.kwargs["auto_wrap_policy"], strategy._activation_checkpointing_kwargs["auto_wrap_policy"]):
        assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {EncoderBlock}
    assert strategy._state_dict_type == "sharded"
    assert config["trainer"]["precision"] == "bf16-mixed"
    assert config["model"]["init_args"]["optim"]["layer_decay"] == 0.75


def fsdp_rank(rank: int, port: int, out: str) -> None:
    """One of two CPU ranks (gloo): the classifier wrapped as Lightning's FSDPStrategy wraps it (full sharding,
    each block its own unit, activation-checkpointed, use_orig_params), its layer-decay groups, one AdamW step,
    then a sharded checkpoint written the way FSDPStrategy.save_checkpoint writes one."""
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    warnings.simplefilter("ignore")  # FSDP's deprecation notes about ShardedTensor, twice per tensor
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        task = tiny_classifier(optim=Optimization(layer_decay=0.75))
        describe = lambda groups: [(g["name"], len(g["params"]), g["lr"], g["weight_decay"]) for g in groups]
        before = describe(param_groups(task.model, 1e-3, 0.05, 0.75))
        whole = describe_param_groups(torch.optim.AdamW(param_groups(task.model, 1e-3, 0.05, 0.75)))
        apply_activation_checkpointing(task, check_fn=lambda m: isinstance(m, EncoderBlock))
        wrapped = FullyShardedDataParallel(task, auto_wrap_policy=ModuleWrapPolicy({EncoderBlock}),
                                           use_orig_params=True, device_id=torch.device("cpu"))
        after = describe(param_groups(task.model, 1e-3, 0.05, 0.75, shapes=task.param_shapes))
        shapeless = describe(param_groups(task.model, 1e-3, 0.05, 0.75))  # what the flat shards alone would give
        optimizer = torch.optim.AdamW(param_groups(task.model, 1e-3, 0.05, 0.75, shapes=task.param_shapes))
        tables = {"whole": whole, "sharded": network_group_table(task.model, optimizer, (), task.param_shapes),
                  "shards": describe_param_groups(optimizer)}  # each rank's flat shards, counted as they are
        torch.manual_seed(rank)
        x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
        task.train_loss(wrapped(x), y).backward()
        optimizer.step()
        with FullyShardedDataParallel.state_dict_type(wrapped, StateDictType.SHARDED_STATE_DICT):
            state = {"model": wrapped.state_dict(), "optimizer_0": FullyShardedDataParallel.optim_state_dict(
                wrapped, optimizer)}
        dcp.save(state, checkpoint_id=Path(out, "last.ckpt"))
        with FullyShardedDataParallel.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT):
            full = wrapped.state_dict()  # the reference: gathered to every rank
        if rank == 0:
            meta = {"epoch": 0, "global_step": 1, "hyper_parameters": dict(task.hparams),
                    "vit": task.checkpoint_meta()}
            torch.save(meta, Path(out, "last.ckpt", "meta.pt"))
            torch.save(full, Path(out, "full.pt"))
            Path(out, "groups.json").write_text(json.dumps({"before": before, "after": after, "shapeless": shapeless,
                                                            "tables": tables}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("fsdp")
    port = free_port()
    mp.spawn(fsdp_rank, args=(port, str(out)), nprocs=2)
    return out


@pytest.mark.processes
@pytest.mark.slow
def test_layer_decay_groups_survive_real_fsdp_shards(sharded):
    groups = json.loads((sharded / "groups.json").read_text())
    assert groups["after"] == groups["before"]
    # embeddings, 2 blocks and the head with and without decay, the final norm without: 9 groups
    assert len({g[0] for g in groups["before"]}) == 9
    assert groups["shapeless"] != groups["before"]  # flat 1-D shards: the test does exercise the fix
    tables = groups["tables"]  # the table fit logs counts each parameter whole, as before the wrap
    assert tables["sharded"] == tables["whole"] != tables["shards"]


@pytest.mark.slow
def test_a_sharded_checkpoint_is_read_whole_in_one_process_and_exported(sharded, tmp_path, capsys):
    from vit.commands import export

    folder = sharded / "last.ckpt"
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert is_intact(folder)
    checkpoint = read_checkpoint(folder)
    full = torch.load(sharded / "full.pt")
    assert checkpoint["state_dict"].keys() == full.keys() and checkpoint["global_step"] == 1
    for key, value in full.items():
        torch.testing.assert_close(checkpoint["state_dict"][key], value, atol=0, rtol=0)

    (path,) = export.main(["--ckpt", str(folder), "--format", "ckpt", "--out", str(tmp_path / "one")])
    assert path.is_file() and "no optimiser state" in capsys.readouterr().out
    from_file, from_folder = load_classifier(path), load_classifier(folder)
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(from_file(x), from_folder(x), atol=0, rtol=0)
    weights = {k.removeprefix("model."): v for k, v in full.items() if k.startswith("model.")}
    assert all(torch.equal(from_file.model.state_dict()[k], v) for k, v in weights.items())
    export.main(["--ckpt", str(folder), "--format", "safetensors", "--out", str(tmp_path / "st")])
    assert (tmp_path / "st" / "model.safetensors").is_file()

    torn = tmp_path / "torn.ckpt"
    torn.mkdir()
    for p in folder.iterdir():
        if p.name != "__1_0.distcp":
            (torn / p.name).write_bytes(p.read_bytes())
    with pytest.raises(DamagedCheckpointError, match=f"sharded checkpoint {torn} cannot be read"):
        read_checkpoint(torn)
