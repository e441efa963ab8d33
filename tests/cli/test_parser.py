"""`vit fit`'s parser (`vit.cli.parser`): the settings groups of a task take dotted overrides, nulls included."""

from __future__ import annotations

import contextlib
import io

import yaml

from tests.conftest import DIGITS
from vit.cli.parser import nested_nulls
from vit.commands import main


def printed_model(*args: str) -> dict:
    """The model section `vit fit --print_config` prints for the digits recipe and ``args``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["fit", "--config", DIGITS, *args, "--print_config"])
    return yaml.safe_load(out.getvalue())["model"]["init_args"]


def test_a_null_inside_optim_or_the_head_is_a_null():
    """`--model.init_args.optim.ema_decay null` turns the recipe's EMA off (jsonargparse alone read it as "None",
    which no float | None takes, and stopped); the other overrides keep theirs."""
    init = printed_model("--model.init_args.optim.lr=0.5", "--model.init_args.optim.ema_decay", "null",
                         "--model.init_args.optim.layer_decay=null", "--model.init_args.head.init_args.mixup_alpha=0.2")
    assert init["optim"]["ema_decay"] is None and init["optim"]["layer_decay"] is None
    assert init["optim"]["lr"] == 0.5 and init["optim"]["warmup_epochs"] == 3  # the recipe's, kept
    assert init["head"]["init_args"]["mixup_alpha"] == 0.2
    assert nested_nulls(["--model.init_args.pretrained", "null", "--trainer.max_epochs=null"]) == [
        "--model.init_args.pretrained", "null", "--trainer.max_epochs=null"]  # one level: left as given
