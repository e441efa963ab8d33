"""`vit average`: the file it writes is a classifier every command loads, and a mismatch is one short line."""

from __future__ import annotations

import pytest
import torch

import vit
from tests.checkpoints.test_average import write
from tests.helpers import DIGITS_VIT, TINY
from vit.commands import main
from vit.deploy import load_classifier


def test_vit_average_writes_a_classifier_with_the_mixed_weights(tmp_path, capsys):
    a, b = write(tmp_path / "a.ckpt", seed=0), write(tmp_path / "b.ckpt", seed=1)
    main(["average", "--ckpt", str(tmp_path / "a.ckpt"), "--ckpt", str(tmp_path / "b.ckpt"), "--alpha", "0.25",
          "--out", str(tmp_path / "wise.ckpt")])
    assert "0.75 x" in capsys.readouterr().out
    reference = vit.create_model(DIGITS_VIT, **TINY).eval()
    reference.load_state_dict({k: 0.75 * a[k] + 0.25 * b[k] for k in a})
    x = torch.randn(4, 1, 8, 8)
    classifier = load_classifier(tmp_path / "wise.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(classifier(x), reference(x))


@pytest.mark.parametrize(("other", "said"), [
    ({"num_classes": 2, "class_names": ["cat", "dog"]}, "different class lists"),
    ({"std": [0.25]}, "different input normalisation"),  # the mean alike, the std alone differs
])
def test_vit_average_refuses_other_classes_or_inputs_in_one_line(tmp_path, capsys, other, said):
    write(tmp_path / "a.ckpt", seed=0)
    write(tmp_path / "b.ckpt", seed=1, **other)
    with pytest.raises(SystemExit) as exited:
        main(["average", "--ckpt", str(tmp_path / "a.ckpt"), "--ckpt", str(tmp_path / "b.ckpt"),
              "--out", str(tmp_path / "soup.ckpt")])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vit average: error: cannot average {tmp_path / 'a.ckpt'} and {tmp_path / 'b.ckpt'}")
    assert said in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "soup.ckpt").exists()


def test_average_arguments_take_every_checkpoint_given():
    from vit.commands.average import parse_args

    args = parse_args(["--ckpt", "a.ckpt", "--ckpt", "b.ckpt", "--out", "c.ckpt"])
    assert args.ckpt == ["a.ckpt", "b.ckpt"] and args.alpha is None and args.out == "c.ckpt"
    with pytest.raises(SystemExit):
        parse_args(["--out", "c.ckpt"])  # no checkpoint
