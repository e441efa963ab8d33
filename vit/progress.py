"""One progress bar for every command: rich's (declared in pyproject; Lightning's bar uses it too)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(iterable: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    """Iterate ``iterable`` under a rich progress bar labelled ``description``."""
    from rich.progress import track

    yield from track(iterable, description=description, total=total)


@contextlib.contextmanager
def progress_while(count: Callable[[], int], total: int, description: str, every: float = 0.5) -> Iterator[None]:
    """A progress bar while the block runs, at ``count()`` of ``total``, asked every ``every`` seconds from a
    thread: for work that shows its progress only from outside, such as worker processes'."""
    from rich.progress import Progress

    stop = threading.Event()
    with Progress(*Progress.get_default_columns()) as bar:
        task = bar.add_task(description, total=total)

        def poll() -> None:
            while not stop.wait(every):
                bar.update(task, completed=min(count(), total))

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
        bar.update(task, completed=total)  # reached only when the block finished
