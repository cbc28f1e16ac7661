"""`loom reproduce SYSTEM`: a paper's experiments on identical seeded workloads, printed as
tables and written as CSV, PNG and JSON."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli.layer import Note, one_of
from loom.cli.options import console

if TYPE_CHECKING:
    from loom.experiments.report import Task

__all__ = ["NOTES", "reproduce"]


def _systems() -> str:
    from loom.experiments.registry import SYSTEMS

    return one_of(SYSTEMS.names())


NOTES: dict[str, Note] = {"system": _systems}


def reproduce(
    system: Annotated[str, typer.Argument(help="the paper's system")],
    quick: Annotated[
        bool, typer.Option("--quick", help="smaller scale, same comparisons: minutes on 2 cores")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of every random draw")] = 1,
    out: Annotated[Path, typer.Option("--out", help="directory for CSV and PNG files")] = Path(
        "results"
    ),
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", help="write tidy records here; `-` prints them to stdout instead of tables"
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option("--only", help="comma-separated experiments to run, e.g. fig14,fig15"),
    ] = None,
) -> None:
    """Run a paper's experiments on identical seeded workloads; print tables, write CSV/PNG/JSON."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from loom.core.errors import UnknownPolicyError
    from loom.experiments.registry import SYSTEMS
    from loom.experiments.report import (
        Record,
        print_tables,
        records_json,
        write_csvs,
        write_json,
    )

    try:
        rep = SYSTEMS.get(system)
    except UnknownPolicyError as exc:
        raise typer.BadParameter(str(exc), param_hint="SYSTEM") from None
    total, tasks = rep.tasks(seed, quick)
    if only is not None:
        tasks, total = _select(tasks, only)
    to_stdout = json_path == Path("-")
    # NOTE: with `--json -` stdout carries the JSON document alone; progress goes to stderr
    out_console = Console(stderr=True) if to_stdout else console
    records: list[Record] = []
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=out_console, transient=False) as progress:
        bar = progress.add_task(f"{system}", total=total)
        for label, thunk in tasks:
            progress.update(bar, description=label)
            records += [{"system": system, **r} for r in thunk()]
            progress.advance(bar)
    records += [{"system": system, **r} for r in rep.summary(records)]
    if not to_stdout:
        print_tables(records, console, title=system)
    out_dir = out / system
    write_csvs(records, out_dir)
    plots = rep.plot(records, out_dir)
    if to_stdout:
        typer.echo(records_json(system, seed, quick, records))
    elif json_path is not None:
        write_json(json_path, system, seed, quick, records)
    out_console.print(
        f"wrote {len(records)} records, CSV and {len(plots)} plots under {out_dir}"
        + (f", JSON at {json_path}" if json_path and not to_stdout else "")
    )


def _select(tasks: Iterable[Task], only: str) -> tuple[Iterator[Task], int]:
    """The tasks of the named experiments (a task's label starts with its experiment)."""
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    listed = list(tasks)
    known = sorted({label.split()[0] for label, _ in listed})
    unknown = sorted(wanted - set(known))
    if unknown or not wanted:
        raise typer.BadParameter(
            f"unknown experiment(s) {unknown or [only]}; choose from {', '.join(known)}",
            param_hint="--only",
        )
    kept = [(label, thunk) for label, thunk in listed if label.split()[0] in wanted]
    return iter(kept), len(kept)
