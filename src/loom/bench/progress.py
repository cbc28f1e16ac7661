"""A progress bar with the time left over a benchmark's runs, drawn on stderr (rich), so that
the lines and tables a benchmark prints on stdout stay readable."""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["RunProgress"]


class RunProgress:
    """`total` units of work (runs, or seconds of a timed run) under `title`; a context
    manager. `step(label)` names what runs now, `advance()` counts a unit done, `update(n)`
    sets how many are done. Lines printed meanwhile appear above the bar where stdout is the
    same terminal, and go to stdout untouched where it is not."""

    def __init__(self, total: float, title: str, *, console: Console | None = None) -> None:
        if not total >= 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.title = title
        # NOTE: rich moves stdout onto its console while the bar is live; only where stdout is
        # a terminal too, or a redirected stdout would land on stderr
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            redirect_stdout=sys.stdout.isatty(),
        )
        self._task: TaskID = self._progress.add_task(title, total=total)

    @property
    def completed(self) -> float:
        return self._progress.tasks[0].completed

    @property
    def total(self) -> float:
        total = self._progress.tasks[0].total
        assert total is not None, "a RunProgress always has a total"
        return total

    def step(self, label: str) -> None:
        """Name the unit running now."""
        self._progress.update(self._task, description=f"{self.title}: {label}")

    def advance(self, units: float = 1.0) -> None:
        self._progress.advance(self._task, units)

    def update(self, completed: float) -> None:
        self._progress.update(self._task, completed=min(completed, self.total))

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()
