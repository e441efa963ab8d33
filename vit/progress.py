"""One progress bar for every command: rich's (declared in pyproject; Lightning's bar uses it too)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(iterable: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    """Iterate ``iterable`` under a rich progress bar labelled ``description``."""
    from rich.progress import track

    yield from track(iterable, description=description, total=total)
