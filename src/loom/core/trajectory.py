"""Rollout vocabulary: a trajectory alternates LLM turns with tool calls until it finishes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

from loom.core.errors import ConfigError

__all__ = ["TrajectorySpec", "TrajectoryStatus", "TurnSpec", "WorkloadKind"]


class WorkloadKind(StrEnum):
    CODING = "coding"
    SEARCH = "search"
    MATH = "math"


class TrajectoryStatus(IntEnum):
    """Ordered lifecycle: `status >= FINISHED` means done."""

    PENDING = 0  # not yet submitted
    QUEUED = 1  # a turn waits for a slot on a worker
    RUNNING = 2  # a turn is prefilling or decoding
    IN_TOOL = 3  # between turns, waiting for a tool call
    FINISHED = 4


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """One LLM turn: `input_tokens` appended before it (prompt or tool output), then
    `output_tokens` generated, then a tool call of `tool_latency_s` (None after the last turn)."""

    input_tokens: int
    output_tokens: int
    tool_latency_s: float | None

    def __post_init__(self) -> None:
        if self.input_tokens < 0 or self.output_tokens < 1:
            raise ConfigError(
                f"a turn needs input_tokens >= 0 and output_tokens >= 1, got "
                f"{self.input_tokens}, {self.output_tokens}"
            )
        if self.tool_latency_s is not None and not self.tool_latency_s >= 0:
            raise ConfigError(f"tool latency must be >= 0 s, got {self.tool_latency_s}")


@dataclass(frozen=True, slots=True)
class TrajectorySpec:
    """The full, ground-truth shape of one trajectory. Simulators reveal it turn by turn;
    policies only ever see what has happened so far plus predictions."""

    traj_id: int
    prompt_id: int
    sample_idx: int
    workload: WorkloadKind | None  # None: not known (a real rollout need not say)
    turns: tuple[TurnSpec, ...]
    prompt_features: tuple[float, ...] = ()  # what a prompt-only predictor may observe

    def __post_init__(self) -> None:
        if not self.turns:
            raise ConfigError(f"trajectory {self.traj_id} has no turns")
        if self.turns[-1].tool_latency_s is not None:
            raise ConfigError(f"trajectory {self.traj_id}: the last turn must not call a tool")
        if any(t.tool_latency_s is None for t in self.turns[:-1]):
            raise ConfigError(f"trajectory {self.traj_id}: every turn but the last calls a tool")

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    @property
    def prompt_tokens(self) -> int:
        return self.turns[0].input_tokens

    @property
    def total_tokens(self) -> int:
        return sum(t.input_tokens + t.output_tokens for t in self.turns)

    @property
    def tool_time_s(self) -> float:
        return sum(t.tool_latency_s or 0.0 for t in self.turns)
