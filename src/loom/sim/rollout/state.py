"""Mutable per-trajectory state kept by the rollout simulator; policies read it as a view."""

from __future__ import annotations

from loom.core.trajectory import TrajectorySpec, TrajectoryStatus

__all__ = ["TrajState"]


class TrajState:
    """Progress of one trajectory. `context` counts every token already part of its KV
    context (prompt, outputs, tool outputs of completed turns)."""

    __slots__ = (
        "context",
        "finish_s",
        "first_arrival_s",
        "generated",
        "host",
        "migrating_to",
        "predictions",
        "prompt_id",
        "queue_delay_s",
        "queued_on",
        "spec",
        "status",
        "steps_done",
        "tool_returned",
        "traj_id",
        "turn_arrival_s",
        "turn_generated",
    )

    def __init__(self, spec: TrajectorySpec, predictions: tuple[float, ...]) -> None:
        self.spec = spec
        self.traj_id = spec.traj_id
        self.prompt_id = spec.prompt_id
        self.predictions = predictions
        self.steps_done = 0
        self.generated = 0
        self.context = 0
        self.turn_generated = 0  # output tokens of the current turn so far
        self.first_arrival_s = 0.0
        self.turn_arrival_s = 0.0
        self.queue_delay_s = 0.0
        self.finish_s = float("nan")
        self.host = -1
        self.migrating_to = -1
        self.queued_on = -1  # worker whose queue holds its waiting turn
        self.tool_returned = False
        self.status = TrajectoryStatus.PENDING

    @property
    def predicted_total(self) -> float:
        p = self.predictions
        if not p:
            return 0.0
        return p[min(self.steps_done, len(p) - 1)]

    @property
    def turn_input(self) -> int:
        return self.spec.turns[self.steps_done].input_tokens

    @property
    def turn_output(self) -> int:
        return self.spec.turns[self.steps_done].output_tokens

    def end_turn(self, now: float) -> bool:
        """The current turn finished at `now`: fold it into the context; True when it was the
        trajectory's last (the trajectory is then FINISHED)."""
        turn = self.spec.turns[self.steps_done]
        self.context += turn.input_tokens + turn.output_tokens
        self.generated += turn.output_tokens
        self.turn_generated = 0
        self.steps_done += 1
        if self.steps_done == self.spec.num_turns:
            self.status = TrajectoryStatus.FINISHED
            self.finish_s = now
            return True
        self.status = TrajectoryStatus.IN_TOOL
        return False

    def full_context(self) -> int:
        """Tokens the current turn's KV must hold right now (before its next token)."""
        return self.context + self.turn_input + self.turn_generated
