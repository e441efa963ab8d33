"""The task metadata of a checkpoint (`vit.checkpoints.meta`): one registry of tasks, the tasks' own names."""

from __future__ import annotations

import importlib

import pytest

from vit.errors import UserValueError


def test_the_registry_names_each_tasks_class_by_its_import_path():
    from vit.checkpoints.meta import TASK_CLASSES
    from vit.tasks import TASKS

    # vit.checkpoints.meta names the classes without importing Lightning: each path must import the class that
    # writes that task, and vit.tasks.TASKS is that same table
    assert set(TASKS) == set(TASK_CLASSES) >= {"classify", "pretrain", "translate", "contrastive"}
    for task, entry in TASK_CLASSES.items():
        module, _, name = entry.class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert cls is TASKS[task] and cls.task == task and entry.class_name == name


def test_a_task_outside_the_registry_is_named_in_the_error_not_looked_up():
    from vit.checkpoints.meta import expect_task

    with pytest.raises(UserValueError, match=r"^x\.ckpt holds the ImageClassifier task \('classify'\), but an "
                                             r"unknown task 'mine' is needed here$"):
        expect_task({"vit": {"task": "classify"}}, "mine", "x.ckpt")
    assert expect_task({"vit": {"task": "mine", "n": 1}}, "mine", "x.ckpt") == {"task": "mine", "n": 1}


def test_the_label_kind_is_written_and_read_in_one_spelling():
    """A multi-label classifier's flag and cuts, as the checkpoints and timm folders already written hold them."""
    from vit.checkpoints.meta import label_meta, label_thresholds

    assert label_meta([0.25, 0.5]) == {"multi_label": True, "thresholds": [0.25, 0.5]}
    assert label_thresholds({"task": "classify", **label_meta([0.25, 0.5])}) == [0.25, 0.5]
    assert label_meta(None) == {}  # one label per image: nothing written
    assert label_thresholds({"task": "classify"}) is None  # nothing read (0.1's checkpoints)
    assert label_thresholds({"multi_label": False, "thresholds": [0.3]}) is None
