"""Finished trajectories as JSON lines: the one history format that the rollout router writes
under its state directory and that the predictor and `loom plan rollout` read.

One line per trajectory, a `TrajectoryRecord`::

    {"trajectory_id": "run7-42", "prompt_id": "gsm8k-311", "workload": "math",
     "prompt_features": [512.0], "turns": [
        {"input_tokens": 512, "output_tokens": 240, "tool_latency_s": 1.5},
        {"input_tokens": 80, "output_tokens": 95, "tool_latency_s": null}]}

Ids are strings (numbers are accepted and kept as their decimal text); `workload`,
`prompt_features` and `sample_idx` are optional. A record maps to a `TrajectorySpec`, whose
ids are integers: a canonical decimal id below 2**63 is its own number, any other string a
stable negative 63-bit hash of its text (the same in every file and process), so that the
prompts of different files group together and a spec with ids >= 0 round-trips exactly.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind

__all__ = [
    "TrajectoryRecord",
    "TurnRecord",
    "read_history",
    "read_records",
    "spec_id",
    "write_history",
]

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")
_ID_LIMIT = 2**63

Id = Annotated[str, Field(min_length=1, max_length=256)]


class _Record(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, coerce_numbers_to_str=True
    )


class TurnRecord(_Record):
    """One LLM turn: tokens appended before it, tokens generated, then the tool call's
    seconds (null after the last turn)."""

    input_tokens: int = Field(ge=0, description="prompt or tool output appended before the turn")
    output_tokens: int = Field(ge=1, description="tokens the turn generated")
    tool_latency_s: float | None = Field(
        default=None, ge=0, description="seconds of the tool call after it; null for the last"
    )


class TrajectoryRecord(_Record):
    """One finished trajectory."""

    trajectory_id: Id
    prompt_id: Id
    sample_idx: int = Field(default=0, ge=0, description="sample of its prompt's group")
    workload: WorkloadKind | None = None
    prompt_features: tuple[float, ...] = Field(
        default=(), description="what a prompt-only predictor may observe"
    )
    turns: tuple[TurnRecord, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _tool_between_turns(self) -> Self:
        if self.turns[-1].tool_latency_s is not None:
            raise ValueError("the last turn must not call a tool (tool_latency_s: null)")
        missing = [i for i, t in enumerate(self.turns[:-1]) if t.tool_latency_s is None]
        if missing:
            raise ValueError(f"every turn but the last calls a tool; turns {missing} do not")
        return self

    @classmethod
    def from_spec(cls, spec: TrajectorySpec) -> TrajectoryRecord:
        return cls(
            trajectory_id=str(spec.traj_id),
            prompt_id=str(spec.prompt_id),
            sample_idx=spec.sample_idx,
            workload=spec.workload,
            prompt_features=spec.prompt_features,
            turns=tuple(
                TurnRecord(
                    input_tokens=t.input_tokens,
                    output_tokens=t.output_tokens,
                    tool_latency_s=t.tool_latency_s,
                )
                for t in spec.turns
            ),
        )

    def to_spec(self) -> TrajectorySpec:
        return TrajectorySpec(
            traj_id=spec_id(self.trajectory_id),
            prompt_id=spec_id(self.prompt_id),
            sample_idx=self.sample_idx,
            workload=self.workload,
            turns=tuple(
                TurnSpec(t.input_tokens, t.output_tokens, t.tool_latency_s) for t in self.turns
            ),
            prompt_features=self.prompt_features,
        )


def spec_id(text: str) -> int:
    """The integer id of a history id: its number if canonical decimal, else a negative hash."""
    if _DECIMAL.fullmatch(text) and int(text) < _ID_LIMIT:
        return int(text)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return -1 - (int.from_bytes(digest, "big") >> 1)


def read_records(path: str | Path) -> list[TrajectoryRecord]:
    """Every record of a history file, in order; blank lines are skipped. A line that is not
    a valid record raises `ConfigError` naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read history {path}: {exc}") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(TrajectoryRecord.model_validate_json(line))
        except ValidationError as exc:
            raise ConfigError(f"{path}:{lineno}: not a trajectory record: {_brief(exc)}") from None
    return records


def read_history(path: str | Path) -> list[TrajectorySpec]:
    """The trajectories of a history file, as specs."""
    return [r.to_spec() for r in read_records(path)]


def write_history(
    path: str | Path,
    trajectories: Iterable[TrajectoryRecord | TrajectorySpec],
    *,
    append: bool = False,
) -> int:
    """Write (or append) one line per trajectory; returns the number written."""
    lines = [
        (t if isinstance(t, TrajectoryRecord) else TrajectoryRecord.from_spec(t)).model_dump_json()
        for t in trajectories
    ]
    with Path(path).open("a" if append else "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return len(lines)


def _brief(exc: ValidationError) -> str:
    """Pydantic's errors on one line: `where: what; ...`."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(x) for x in err["loc"])
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts)
