"""The task metadata of a checkpoint (`vit.checkpoints.meta`): its task names are the tasks' own."""

from __future__ import annotations


def test_the_checkpoints_task_names_are_the_tasks_own():
    from vit.checkpoints.meta import TASK_CLASSES
    from vit.tasks import TASKS

    # vit.checkpoints.meta names the classes without importing Lightning: the names must stay the classes'
    assert {task: cls.__name__ for task, cls in TASKS.items()} == {task: c for task, (c, _) in TASK_CLASSES.items()}


def test_the_label_kind_is_written_and_read_in_one_spelling():
    """A multi-label classifier's flag and cuts, as the checkpoints and timm folders already written hold them."""
    from vit.checkpoints.meta import label_meta, label_thresholds

    assert label_meta([0.25, 0.5]) == {"multi_label": True, "thresholds": [0.25, 0.5]}
    assert label_thresholds({"task": "classify", **label_meta([0.25, 0.5])}) == [0.25, 0.5]
    assert label_meta(None) == {}  # one label per image: nothing written
    assert label_thresholds({"task": "classify"}) is None  # nothing read (0.1's checkpoints)
    assert label_thresholds({"multi_label": False, "thresholds": [0.3]}) is None
