"""The task metadata of a checkpoint (`vit.checkpoints.meta`): its task names are the tasks' own."""

from __future__ import annotations


def test_the_checkpoints_task_names_are_the_tasks_own():
    from vit.checkpoints.meta import TASK_CLASSES
    from vit.tasks import TASKS

    # vit.checkpoints.meta names the classes without importing Lightning: the names must stay the classes'
    assert {task: cls.__name__ for task, cls in TASKS.items()} == {task: c for task, (c, _) in TASK_CLASSES.items()}
