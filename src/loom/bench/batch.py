"""A benchmark's batch: the agentic workload generator's trajectories scaled down (or not) to
what the engines at hand finish in minutes, each turn a context to send, a length to generate
and a tool latency to sleep; with the tokens the agents send drawn once, before any run."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.history import TrajectoryRecord, TurnRecord
from loom.rollout.history import write_history as write_history_file
from loom.runtime.rollout.prediction import HISTORY_FILE
from loom.sim.workloads.agentic import AgenticWorkload

__all__ = [
    "VOCAB",
    "Batch",
    "BatchConfig",
    "Draws",
    "Turn",
    "batch_size",
    "draw_tokens",
    "history_specs",
    "scaled_batch",
    "to_spec",
    "write_history",
]

VOCAB = 500  # agents draw prompt and tool tokens from ids 3..VOCAB-1


@dataclass(frozen=True)
class Turn:
    """One turn as the agents replay it: tokens appended before it (prompt or tool reply),
    tokens it generates, and the tool call after it (None after the last)."""

    input_tokens: int
    output_tokens: int
    tool_s: float | None


Batch = list[tuple[TrajectorySpec, list[Turn]]]
# each trajectory's drawn tokens, per turn: the prompt's, then each tool reply's
Draws = dict[int, list[list[int]]]


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Which batch: Heddle's agentic workload `kind` (`prompts` x `samples` trajectories of
    qwen3-14b's shape), its token counts times `token_scale` and capped at `max_turn_tokens`,
    its tool latencies times `tool_scale`, at most `max_turns` turns each; `history` earlier
    epochs of the same prompts for the router's predictor."""

    kind: WorkloadKind = WorkloadKind.CODING
    prompts: int = 4
    samples: int = 4
    seed: int = 1
    token_scale: float = 0.05
    tool_scale: float = 0.05
    max_turn_tokens: int = 256
    max_turns: int = 8
    history: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", WorkloadKind(self.kind))
        if min(self.prompts, self.samples, self.max_turn_tokens, self.max_turns) < 1:
            raise ConfigError("prompts, samples, max_turn_tokens and max_turns must be >= 1")
        if not (self.token_scale > 0 and self.tool_scale >= 0):
            raise ConfigError(
                f"token_scale must be > 0 and tool_scale >= 0, got {self.token_scale}, "
                f"{self.tool_scale}"
            )
        if self.history < 0:
            raise ConfigError(f"history must be >= 0 epochs, got {self.history}")

    def workload(self) -> AgenticWorkload:
        return AgenticWorkload(
            kind=self.kind,
            model="qwen3-14b",
            num_prompts=self.prompts,
            samples=self.samples,
            prompt_seed=self.seed,
        )


def _scaled(config: BatchConfig, n: int) -> int:
    return max(1, min(config.max_turn_tokens, round(n * config.token_scale)))


def scaled_batch(config: BatchConfig, epoch: int | None = None) -> Batch:
    """The batch of epoch `epoch` (default: the one after the history's, `100 + seed`)."""
    out = []
    for spec in config.workload().sample(100 + config.seed if epoch is None else epoch):
        turns = [
            Turn(
                _scaled(config, t.input_tokens),
                _scaled(config, t.output_tokens),
                None if t.tool_latency_s is None else t.tool_latency_s * config.tool_scale,
            )
            for t in spec.turns[: config.max_turns]
        ]
        turns[-1] = Turn(turns[-1].input_tokens, turns[-1].output_tokens, None)
        out.append((spec, turns))
    return out


def batch_size(batch: Batch) -> tuple[int, int, int]:
    """(trajectories, turns, output tokens) of `batch`."""
    turns = sum(len(t) for _, t in batch)
    return len(batch), turns, sum(x.output_tokens for _, t in batch for x in t)


def to_spec(spec: TrajectorySpec, turns: list[Turn]) -> TrajectorySpec:
    """The scaled trajectory as the simulator takes it; its prompt feature is what the
    router's predictor sees (the prompt's tokens)."""
    return TrajectorySpec(
        traj_id=spec.traj_id,
        prompt_id=spec.prompt_id,
        sample_idx=spec.sample_idx,
        workload=None,
        turns=tuple(TurnSpec(t.input_tokens, t.output_tokens, t.tool_s) for t in turns),
        prompt_features=(float(turns[0].input_tokens),),
    )


def history_specs(config: BatchConfig) -> list[TrajectorySpec]:
    """The `history` earlier epochs, scaled like the batch, as the simulator's predictor
    learns from them."""
    return [to_spec(s, t) for e in range(config.history) for s, t in scaled_batch(config, e)]


def write_history(config: BatchConfig, state_dir: Path) -> int:
    """The `history` earlier epochs, scaled like the batch, as the history file of a router
    whose state is `state_dir`: its predictor starts fitted, as Heddle's is after the first
    steps of training. The number of trajectories written."""
    records = [
        TrajectoryRecord(
            trajectory_id=f"h{epoch}-{spec.traj_id}",
            prompt_id=str(spec.prompt_id),
            prompt_features=(float(turns[0].input_tokens),),
            turns=tuple(
                TurnRecord(
                    input_tokens=t.input_tokens,
                    output_tokens=t.output_tokens,
                    tool_latency_s=t.tool_s,
                )
                for t in turns
            ),
        )
        for epoch in range(config.history)
        for spec, turns in scaled_batch(config, epoch)
    ]
    state_dir.mkdir(parents=True, exist_ok=True)
    return write_history_file(state_dir / HISTORY_FILE, records)


def _rng(seed: int, spec: TrajectorySpec) -> random.Random:
    """The agent's draws of prompt and tool tokens: the same through every router."""
    return random.Random(seed * 7919 + spec.traj_id)


def draw_tokens(batch: Batch, seed: int) -> Draws:
    """Each trajectory's prompt and tool-reply tokens, per turn, drawn once before any run:
    at paper scale they are millions of tokens, whose drawing inside a run would charge the
    agents' CPU to the makespan."""
    out: Draws = {}
    for spec, turns in batch:
        rng = _rng(seed, spec)
        out[spec.traj_id] = [
            [rng.randrange(3, VOCAB) for _ in range(t.input_tokens)] for t in turns
        ]
    return out
