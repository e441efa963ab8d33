"""`vit.progress`: the bar passes every item through, and the polled bar ends at the total."""

from __future__ import annotations

import time

from vit.progress import progress, progress_while


def test_progress_yields_every_item_in_order(capsys):
    assert list(progress(iter(range(5)), total=5, description="counting")) == [0, 1, 2, 3, 4]


def test_progress_while_polls_the_count_until_the_block_ends(capsys):
    asked = []

    def count() -> int:
        asked.append(time.monotonic())
        return len(asked)

    with progress_while(count, total=100, description="working", every=0.01):
        time.sleep(0.2)
    assert len(asked) >= 3  # polled from its thread while the block ran
    n = len(asked)
    time.sleep(0.05)
    assert len(asked) == n  # and no more once it ended
