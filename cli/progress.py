"""Progress display for `prl-actors up`: a rich bar on a terminal, a few plain lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def warm_start_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A callback `(done, total)` for the built-in model's warm start, shown while the block runs."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    t0, shown = time.monotonic(), set()

    def line(done: int, total: int) -> None:
        quarter = 4 * done // max(1, total)
        if quarter not in shown and (quarter > 0 or done == 1):
            shown.add(quarter)
            print(f"  {label}: {done}/{total} steps ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)

    yield line
