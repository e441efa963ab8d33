"""scripts/experiments/distill_table.py: each seed's students are taught by that seed's teacher, and the table adds up.

The recipes themselves run end to end in tests/test_recipes.py; here `vit fit` is replaced by a recorder (the
figures live in docs/small-folders.md: minutes per run, no timed test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import load_script


def test_the_students_read_their_seeds_teacher_and_the_table_adds_up(tmp_path, monkeypatch):
    script = load_script("distill_table")
    for split in ("train", "val", "test"):
        (tmp_path / "digits" / split).mkdir(parents=True)
    calls: list[tuple[list[str], Path]] = []
    accuracy = {"scratch_small": 0.90, "teacher_small": 0.95, "distill_small": 0.93}

    def fake_fit(args: list[str], work: Path) -> dict:
        calls.append((args, work))
        config = Path(args[args.index("--config") + 1]).stem
        if config == "teacher_small":  # where the teacher recipe writes its best checkpoint
            (work / "logs" / "teacher_small" / "checkpoints").mkdir(parents=True)
        soft = "soft" in args
        return {"acc": accuracy[config] - 0.01 * soft + 0.01 * int(args[args.index("--seed_everything") + 1]),
                "steps": 1}

    monkeypatch.setattr(script, "run_vit_fit", fake_fit)
    results = script.main([str(tmp_path / "digits"), "--seeds", "2", "--epochs", "1", "--recipe_args",
                           "--data.init_args.hflip 0"])
    assert [Path(a[a.index("--config") + 1]).stem for a, _ in calls] == [
        "scratch_small", "teacher_small", "distill_small", "distill_small", "distill_small"] * 2
    for seed in (0, 1):
        (_, teacher_work), *students = calls[5 * seed + 1:5 * seed + 4]
        alone = calls[5 * seed + 4][0]  # the student's recipe without a teacher: the control
        assert alone[-2:] == ["--model.class_path", "vit.tasks.ImageClassifier"]  # last: the teacher options drop
        assert "--model.init_args.teacher" not in alone
        for args, _ in students:
            assert args[args.index("--model.init_args.teacher_dir") + 1] == str(
                teacher_work / "logs" / "teacher_small" / "checkpoints")  # this seed's teacher, by `teacher: best`
            assert args[args.index("--model.init_args.teacher") + 1] == "best"
            assert args[args.index("--seed_everything") + 1] == str(seed)
        assert [a[a.index("--model.init_args.distillation") + 1] for a, _ in students] == ["hard", "soft"]
        hard, soft = (a for a, _ in students)  # hard: DeiT's alpha; soft: the recipe's own
        assert hard[hard.index("--model.init_args.distill_alpha") + 1] == "0.5"
        assert "--model.init_args.distill_alpha" not in soft
    assert all("--data.init_args.hflip" in a and a[a.index("--trainer.max_epochs") + 1] == "1" for a, _ in calls)
    arms = results["digits"]
    assert arms["hard"]["mean"] == pytest.approx(0.935) and arms["soft"]["mean"] == pytest.approx(0.925)
    assert arms["teacher"]["spread"] == pytest.approx(0.01)
    line = script.table(results).splitlines()[-1]
    ratio = (arms["teacher"]["seconds"] + arms["soft"]["seconds"]) / arms["scratch"]["seconds"]
    assert line.startswith("| digits | 0.905 (1.0), ") and line.endswith(f" | {ratio:.2f} |")
    with pytest.raises(SystemExit):
        script.main([str(tmp_path / "digits"), "--arms", "hard"])  # a student needs its teacher


def test_teacher_and_student_args_reach_their_arms_only_and_win(tmp_path, monkeypatch):
    script = load_script("distill_table")
    for split in ("train", "val", "test"):
        (tmp_path / "tiles" / split).mkdir(parents=True)
    calls: dict[str, list[str]] = {}

    def fake_fit(args: list[str], work: Path) -> dict:
        calls[work.name] = args
        if work.name == "teacher":
            (work / "logs" / "teacher_small" / "checkpoints").mkdir(parents=True)
        return {"acc": 0.5, "steps": 1}

    monkeypatch.setattr(script, "run_vit_fit", fake_fit)
    smoothing = "--model.init_args.head.init_args.label_smoothing"
    script.main([str(tmp_path / "tiles"), "--seeds", "1", "--teacher_args", f"{smoothing} 0",
                 "--student_args", "--model.init_args.teacher last"])
    last = lambda args, flag: [args[i + 1] for i, a in enumerate(args) if a == flag][-1]  # what jsonargparse keeps
    assert last(calls["teacher"], smoothing) == "0"
    assert all(smoothing not in calls[arm] for arm in ("scratch", "hard", "soft", "alone"))
    assert [last(calls[arm], "--model.init_args.teacher") for arm in ("hard", "soft")] == ["last", "last"]
    assert "--model.init_args.teacher" not in calls["scratch"] + calls["teacher"]
