"""scripts/bench/figures.py: the comparison with the committed table, without training (the runs take minutes)."""

import json
import statistics

import pytest

from tests import SCRIPTS, load_script

TABLE = {"figures": {"digits": {"mean": 0.95, "std": 0.01, "tol": 0.03}}}


@pytest.fixture(scope="module")
def figures():
    return load_script("figures")


@pytest.mark.parametrize(("values", "ok"), [
    ([0.95], True), ([0.9799], True), ([0.9201], True),  # inside, both sides
    ([0.9801], False), ([0.9199], False),  # just outside, both sides
    ([0.90, 1.0], True), ([0.90, 0.92], False),  # the mean over the seeds is compared
])
def test_a_figure_holds_within_the_tables_tolerance_on_both_sides(figures, values, ok):
    (row,) = figures.compare(TABLE, {"digits": values})
    assert row["ok"] is ok
    assert row["measured"] == pytest.approx(sum(values) / len(values))
    assert (row["expected"], row["tol"]) == (0.95, 0.03)


def test_a_figure_missing_from_the_table_fails_and_says_so(figures):
    rows = figures.compare(TABLE, {"digits": [0.95], "reverse": [0.9]})
    assert [(r["figure"], r["ok"]) for r in rows] == [("digits", True), ("reverse", False)]
    assert "not in the table" in figures.render(rows) and "OUT" in figures.render(rows)
    assert figures.compare({}, {"digits": [0.95]})[0]["ok"] is False


def test_record_writes_mean_sample_std_and_the_tolerance_rule(figures):
    values = [0.91, 0.95, 0.96]
    table = figures.record({"figures": {"reverse": {"mean": 0.5}}}, {"digits": values}, [0, 1, 2])
    row = table["figures"]["digits"]
    std = statistics.stdev(values)  # n - 1, independently of the script
    assert row["mean"] == pytest.approx(statistics.mean(values), abs=1e-4)
    assert row["std"] == pytest.approx(std, abs=1e-4)
    assert row["tol"] == pytest.approx(max(3 * std, 0.02), abs=1e-4) and row["seeds"] == [0, 1, 2]
    assert table["figures"]["reverse"] == {"mean": 0.5}  # a figure not re-measured is kept
    # a tight spread takes the floor
    assert figures.record({}, {"digits": [0.95, 0.951, 0.952]}, [0, 1, 2])["figures"]["digits"]["tol"] == 0.02


def test_main_exits_1_when_a_figure_is_outside_and_0_when_all_hold(figures, tmp_path, monkeypatch, capsys):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(TABLE))
    measured = {"digits": [0.90]}
    monkeypatch.setattr(figures, "measure", lambda names, seeds, overrides: measured)
    assert figures.main(["--only", "digits", "--table", str(path)]) == 1
    assert "| digits | 0.9000 | 0.9500 +- 0.0300 | OUT |" in capsys.readouterr().out
    measured["digits"] = [0.96]
    assert figures.main(["--only", "digits", "--table", str(path)]) == 0


def test_overrides_go_to_their_figure_and_a_bad_one_is_refused(figures):
    assert figures.parse_overrides(["digits:model.init_args.optim.lr=0.04", "reverse:--trainer.max_steps=10"]) == {
        "digits": ["--model.init_args.optim.lr=0.04"], "reverse": ["--trainer.max_steps=10"]}
    for bad in ("digits", "nope:a=1", "digits:lr"):
        with pytest.raises(SystemExit, match="NAME:key=value"):
            figures.parse_overrides([bad])


def test_the_char_task_is_deterministic_shifted_and_its_test_words_unseen(figures, tmp_path):
    options = figures.char_tsv(tmp_path / "a", n_train=50, n_test=10)
    figures.char_tsv(tmp_path / "b", n_train=50, n_test=10)
    assert (tmp_path / "a" / "train.tsv").read_text() == (tmp_path / "b" / "train.tsv").read_text()
    pairs = {s: [line.split("\t") for line in (tmp_path / "a" / f"{s}.tsv").read_text().splitlines()]
             for s in ("train", "test")}
    assert (len(pairs["train"]), len(pairs["test"])) == (50, 10)
    assert all(target == "".join(chr(ord(c) + 1) for c in source) for source, target in pairs["train"])
    assert not {s for s, _ in pairs["train"]} & {s for s, _ in pairs["test"]}
    assert options == [f"--data.init_args.train={tmp_path / 'a' / 'train.tsv'}",
                       f"--data.init_args.test={tmp_path / 'a' / 'test.tsv'}"]


def test_the_committed_table_has_every_figure_its_tolerance_and_the_versions(figures):
    table = json.loads((SCRIPTS / "bench" / "figures.json").read_text())
    env = table["measured_with"]
    for key in ("python", "torch", "torchvision", "timm", "lightning", "torchmetrics", "numpy", "cpu", "cpu_flags"):
        assert env[key], key
    assert set(table["figures"]) == set(figures.FIGURES)
    for name, row in table["figures"].items():
        assert len(row["values"]) == len(row["seeds"]) >= 3, name
        assert row["mean"] == pytest.approx(statistics.mean(row["values"]), abs=1e-4), name
        assert row["tol"] == pytest.approx(max(3 * statistics.stdev(row["values"]), row["floor"]), abs=2e-4), name
        assert row["metric"] == figures.FIGURES[name].metric and row["reduced"], name
