"""The systems `loom reproduce` knows, keyed by enum."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from loom.core.registry import Registry
from loom.experiments.report import Record, Task

__all__ = ["SYSTEMS", "Reproduction", "SystemKind"]


class SystemKind(StrEnum):
    HEDDLE = "heddle"
    TANGRAM = "tangram"
    ROLLMUX = "rollmux"
    ROSE = "rose"
    PLEXRL = "plexrl"


@dataclass(frozen=True)
class Reproduction:
    """How to reproduce one system: tasks to run, plots to draw, headline ratios."""

    tasks: Callable[[int, bool], tuple[int, Iterator[Task]]]
    plot: Callable[[list[Record], Path], list[Path]]
    summary: Callable[[list[Record]], list[Record]]


SYSTEMS: Registry[SystemKind, Reproduction] = Registry("system", SystemKind)


def _heddle() -> Reproduction:
    from loom.experiments import heddle

    return Reproduction(
        tasks=lambda seed, quick: heddle.run_experiments(seed, quick),
        plot=heddle.plot,
        summary=heddle.summary,
    )


def _tangram() -> Reproduction:
    from loom.experiments import tangram

    return Reproduction(
        tasks=lambda seed, quick: tangram.run_experiments(seed, quick),
        plot=tangram.plot,
        summary=tangram.summary,
    )


SYSTEMS.add(SystemKind.HEDDLE, _heddle())
SYSTEMS.add(SystemKind.TANGRAM, _tangram())


def _rollmux() -> Reproduction:
    from loom.experiments import rollmux

    return Reproduction(
        tasks=lambda seed, quick: rollmux.run_experiments(seed, quick),
        plot=rollmux.plot,
        summary=rollmux.summary,
    )


SYSTEMS.add(SystemKind.ROLLMUX, _rollmux())


def _rose() -> Reproduction:
    from loom.experiments import rose

    return Reproduction(
        tasks=lambda seed, quick: rose.run_experiments(seed, quick),
        plot=rose.plot,
        summary=rose.summary,
    )


SYSTEMS.add(SystemKind.ROSE, _rose())


def _plexrl() -> Reproduction:
    from loom.experiments import plexrl

    return Reproduction(
        tasks=lambda seed, quick: plexrl.run_experiments(seed, quick),
        plot=plexrl.plot,
        summary=plexrl.summary,
    )


SYSTEMS.add(SystemKind.PLEXRL, _plexrl())
