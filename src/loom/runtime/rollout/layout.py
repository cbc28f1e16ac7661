"""Heddle's engine layout as slots of GPUs, and what changing it takes: which engines stay,
which stop and which start. No I/O: the fleet (`fleet.py`) starts and stops what this says.

A layout is a degree per engine; its slots pack the engines onto the GPUs largest first, so
that engines of powers of two never span two nodes. An engine keeps running across a change
only where the new layout has an engine of the same degree on the same GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec
from loom.runtime.rollout.config import FleetConfig
from loom.runtime.rollout.plan import PlanSettings, plan_rollout

EMULATED_MAX_RUNNING = 1024  # an emulated engine's default (the simulator's worker's)

__all__ = [
    "EMULATED_MAX_RUNNING",
    "Change",
    "Slot",
    "change",
    "emulated_model",
    "planned_layout",
    "slots",
]


@dataclass(frozen=True, slots=True)
class Slot:
    """One engine of a layout: its degree and the GPUs (global indices) it runs on."""

    tp: int
    gpus: tuple[int, ...]
    node: int

    @property
    def name(self) -> str:
        """Its id in the router: `tp2-g4` runs at degree 2 from GPU 4."""
        return f"tp{self.tp}-g{self.gpus[0]}"

    def devices(self, gpus_per_node: int) -> str:
        """Its GPUs as CUDA_VISIBLE_DEVICES on its node."""
        return ",".join(str(g % gpus_per_node) for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Change:
    """From one layout to the next: engines that keep running, stop, and start."""

    keep: tuple[Slot, ...]
    stop: tuple[Slot, ...]
    start: tuple[Slot, ...]

    @property
    def none(self) -> bool:
        return not self.stop and not self.start


def slots(degrees: Sequence[int], gpus: int, gpus_per_node: int) -> tuple[Slot, ...]:
    """`degrees` packed onto `gpus` GPUs, largest first; ConfigError where they do not fit
    (more GPUs than there are, or an engine that would span two nodes)."""
    if not degrees or min(degrees) < 1:
        raise ConfigError(f"a layout needs degrees >= 1, got {list(degrees)}")
    if sum(degrees) > gpus:
        raise ConfigError(f"the layout {list(degrees)} needs {sum(degrees)} GPUs; there are {gpus}")
    out, first = [], 0
    for tp in sorted(degrees, reverse=True):
        node = first // gpus_per_node
        if (first + tp - 1) // gpus_per_node != node:
            raise ConfigError(
                f"an engine of degree {tp} from GPU {first} would span two nodes of "
                f"{gpus_per_node} GPUs"
            )
        out.append(Slot(tp, tuple(range(first, first + tp)), node))
        first += tp
    return tuple(out)


def change(current: Sequence[Slot], new: Sequence[Slot]) -> Change:
    """What moving from `current` to `new` takes."""
    now, then = set(current), set(new)
    return Change(
        keep=tuple(s for s in current if s in then),
        stop=tuple(s for s in current if s not in then),
        start=tuple(s for s in new if s not in now),
    )


def planned_layout(
    config: FleetConfig,
    history: Sequence[TrajectorySpec],
    model: str,
    gpu: str,
    *,
    batch: int | None = None,
    max_running: int = EMULATED_MAX_RUNNING,
) -> tuple[int, ...]:
    """The degrees to run: the fixed layout; else Heddle's plan on the roofline of the
    emulated GPU (else of `model` on `gpu`: `loom plan rollout`) for a batch like the
    history's latest `batch` trajectories, on engines that run `max_running` turns at once;
    with no history, every engine at the smallest degree."""
    if config.layout is not None:
        return config.layout
    smallest = min(config.degrees)
    if not history:
        return (smallest,) * (config.gpus // smallest)
    if config.emulate is not None:
        model, gpu = emulated_model(config.emulate)
    settings = PlanSettings(
        gpus=config.gpus,
        degrees=config.degrees,
        model=model,
        gpu=gpu,
        gpus_per_node=config.gpus_per_node,
        batch=batch,
        max_running=max_running,
        simulate=config.simulate,
    )
    return plan_rollout(history, settings).degrees


def emulated_model(spec: str) -> tuple[str, str]:
    """The model and GPU of `MODEL@GPU`."""
    model, at, gpu = spec.partition("@")
    if not at or not model or not gpu or ":" in gpu:
        raise ConfigError(f"fleet.emulate must be MODEL@GPU (the degree is the layout's): {spec!r}")
    return model, gpu
