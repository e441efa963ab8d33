"""`vit translate`: errors a user can meet."""

from __future__ import annotations

import pytest
import torch

from vit.commands import run


def test_translate_command_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        run(["translate", "--ckpt", str(tmp_path / "nope.ckpt"), "a b"])
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"num_classes": 10}}, other)
    with pytest.raises(ValueError, match=r"other\.ckpt holds no `vit` task .*, but the Translator task"):
        run(["translate", "--ckpt", str(other), "a b"])


@pytest.mark.parametrize(("batch_size", "accepted"), [(1, True), (0, False)])
def test_translate_batches_one_sentence_at_least(batch_size, accepted):
    from vit.commands.translate import parse_args

    argv = ["--ckpt", "m.ckpt", "a sentence", "--batch_size", str(batch_size)]
    if accepted:
        assert parse_args(argv).sentences == ["a sentence"]
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)
