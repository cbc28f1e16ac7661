"""What the router knows of each engine's room and pace: the numbers its admission decides by.

The router forwards a turn at once while its engine has room (`Capacity`, from what the engine
says of itself), and weighs a move (late binding, migration) or a preemption by time: the wait
it saves against the prefill it costs (`Pace`, measured, and the engine's latency model).
Plain objects on the driver's event loop; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loom.rollout.moves import Pace
from loom.runtime.rollout.turn import EngineLoad, Key

__all__ = ["Capacity", "Pace", "engine_priority"]


@dataclass
class Capacity:
    """How many of the router's turns an engine runs at once without queueing them: the least
    of the cap it is configured with, the limit it states (SGLang's `max_running_requests`)
    and what its load reports show (`learned`).

    A report of requests waiting in the engine's own queue sets the learned limit to the
    router's turns in flight there less that queue (others' requests count too: the engine is
    full either way); a KV cache at least `kv_full` full keeps it where it is; a report of
    neither lets it grow by a quarter (at least one) while the router uses all of it, up to
    the other limits, beyond which it is unknown again (infinite)."""

    configured: int | None = None
    stated: int | None = None
    kv_full: float = 0.95
    learned: float = math.inf

    @property
    def limit(self) -> float:
        return min(
            math.inf if self.configured is None else self.configured,
            math.inf if self.stated is None else self.stated,
            self.learned,
        )

    def observe(self, load: EngineLoad, ours: int) -> None:
        """A load report arrived while the router had `ours` turns in flight there."""
        if load.max_running:
            self.stated = load.max_running
        if load.waiting > 0:
            self.learned = max(1, ours - load.waiting)
        elif load.kv_usage is not None and load.kv_usage >= self.kv_full:
            self.learned = max(1, min(self.learned, ours))
        elif self.learned < math.inf and ours >= self.learned:
            self.learned += max(1, int(self.learned) // 4)
            bound = min(
                math.inf if self.configured is None else self.configured,
                math.inf if self.stated is None else self.stated,
            )
            if self.learned >= bound:
                self.learned = math.inf


_CLASS = 2**59  # the client's priority class, clamped to [-7, 7]
_STAGE = 2**57  # aged (0) before the others (1)
_SPAN = 2**55  # the scheduler's key, in thousandths, clamped to [-2**55, 2**55)


def engine_priority(key: Key, high_first: bool) -> int:
    """A turn's rank as an engine's request `priority`, a 64-bit integer in the same order:
    vLLM runs lower values first; an engine that runs higher ones first (SGLang's default)
    gets the value negated."""
    cls, stage, value = key
    scaled = max(-_SPAN, min(_SPAN - 1, int(value * 1000)))
    out = max(-7, min(7, cls)) * _CLASS + stage * _STAGE + scaled
    return -out if high_first else out
