"""scripts/experiments/transfer_digits.py runs end to end (tiny settings: a smoke test; the figures are in the
README)."""

import json

import pytest

from tests import load_script


@pytest.mark.slow
def test_transfer_script_reports_the_three_methods(tmp_path):
    transfer = load_script("transfer_digits")
    out = tmp_path / "transfer.json"
    summary = transfer.main(["--pretrain_epochs", "1", "--steps", "3", "--lrs", "0.003", "--seeds", "0",
                             "--json", str(out)])
    assert json.loads(out.read_text()) == summary
    assert set(summary) == {"scratch", "linear probe", "fine-tune"}
    for result in summary.values():  # one draw: the mean is that run, a count of the 179 test digits 5-9
        (run,) = result["runs"]
        assert result["mean"] == run and abs(run * 179 - round(run * 179)) < 1e-4


@pytest.mark.slow
def test_a_draw_scores_the_same_alone_as_after_another():
    """Each (draw, method, lr) run is seeded on its own, so `--seeds 1` reproduces draw 1 of `--seeds 0 1`."""
    transfer = load_script("transfer_digits")
    tiny = ["--pretrain_epochs", "1", "--steps", "3", "--lrs", "0.003"]
    both, alone = transfer.main([*tiny, "--seeds", "0", "1"]), transfer.main([*tiny, "--seeds", "1"])
    assert {m: r["runs"][1] for m, r in both.items()} == {m: r["runs"][0] for m, r in alone.items()}
