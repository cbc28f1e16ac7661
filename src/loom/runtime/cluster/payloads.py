"""What each operation of a deployment takes, checked against the model it runs: the service
refuses a bad payload at submission (400) and every rank checks it again before it computes,
so that a payload no rank can run fails on every rank alike, before any collective.

A payload is strict JSON: token ids are integers inside the vocabulary, a batch's rows are of
one length, a field that no operation of that kind reads is refused by name, never dropped.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from loom.core.errors import ConfigError

__all__ = ["BUILTIN_MODEL", "FAULT_OP", "MAX_NEW_TOKENS", "check_payload"]

BUILTIN_MODEL = "tiny"  # what a deployment's `model` names: the one model it runs today
FAULT_OP = "inject_fault"  # test-only: a rank raises, hangs or exits inside a collective
MAX_NEW_TOKENS = 4096


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _batch(ids: list[list[int]], info: ValidationInfo, min_len: int) -> list[list[int]]:
    if not ids:
        raise ValueError("the batch is empty")
    width = len(ids[0])
    for i, row in enumerate(ids):
        if len(row) != width:
            raise ValueError(
                f"a ragged batch: row 0 has {width} tokens, row {i} has {len(row)} "
                "(pad the rows to one length)"
            )
    if width < min_len:
        raise ValueError(f"rows of {width} tokens: this operation needs at least {min_len}")
    vocab = int((info.context or {})["vocab"])
    for i, row in enumerate(ids):
        if row and (min(row) < 0 or max(row) >= vocab):  # (min and max: no loop in Python)
            j, t = next((j, t) for j, t in enumerate(row) if not 0 <= t < vocab)
            raise ValueError(
                f"token id {t} at row {i}, position {j} is outside the model's "
                f"vocabulary [0, {vocab})"
            )
    return ids


Ids = Annotated[list[list[int]], Field(description="token ids, one row per sequence")]


class _Forward(_Payload):
    ids: Ids

    @field_validator("ids")
    @classmethod
    def _ids(cls, v: list[list[int]], info: ValidationInfo) -> list[list[int]]:
        return _batch(v, info, min_len=2)  # a log-probability needs a token and its context


class _ForwardBackward(_Forward):
    advantages: list[float] | None = None

    @field_validator("advantages")
    @classmethod
    def _adv(cls, v: list[float] | None, info: ValidationInfo) -> list[float] | None:
        ids = info.data.get("ids")
        if v is not None and ids is not None and len(v) != len(ids):
            raise ValueError(f"{len(v)} advantages for {len(ids)} rows")
        if v is not None and not all(math.isfinite(a) for a in v):
            raise ValueError("advantages must be finite numbers")
        return v


class _OptimStep(_Payload):
    lr: float | None = Field(default=None, gt=0, le=1.0)


class _Generate(_Payload):
    ids: Ids
    max_tokens: int = Field(default=8, ge=1, le=MAX_NEW_TOKENS)

    @field_validator("ids")
    @classmethod
    def _ids(cls, v: list[list[int]], info: ValidationInfo) -> list[list[int]]:
        return _batch(v, info, min_len=1)


class _Checkpoint(_Payload):
    path: str = Field(min_length=1, max_length=4096)


class _SyncWeights(_Payload):
    tp: int | None = Field(default=None, ge=1, le=1024)

    @field_validator("tp")
    @classmethod
    def _tp(cls, v: int | None, info: ValidationInfo) -> int | None:
        split = int((info.context or {})["tp_split"])
        if v is not None and split % v:
            raise ValueError(
                f"tp={v} does not split the model's sharded dimensions evenly (it must divide "
                f"{split})"
            )
        return v


class _Offload(_Payload):
    tier: Literal["host", "disk"] = "host"


class _Load(_Payload):
    pass


class _Fault(_Payload):
    rank: int = Field(ge=0)
    action: Literal["raise", "hang", "exit"]
    hang_s: float = Field(default=3600.0, gt=0)

    @field_validator("rank")
    @classmethod
    def _rank(cls, v: int, info: ValidationInfo) -> int:
        ranks = int((info.context or {})["ranks"])
        if v >= ranks:
            raise ValueError(f"no rank {v}: the deployment has {ranks}")
        return v


_SCHEMAS: dict[str, type[_Payload]] = {
    "forward": _Forward,
    "forward_backward": _ForwardBackward,
    "optim_step": _OptimStep,
    "generate": _Generate,
    "save_ckpt": _Checkpoint,
    "load_ckpt": _Checkpoint,
    "sync_weights": _SyncWeights,
    "offload": _Offload,
    "load": _Load,
    FAULT_OP: _Fault,
}


def check_payload(op: str, payload: Any, *, vocab: int, dim: int, heads: int, ranks: int) -> None:
    """Refuse a payload `op` cannot run on `ranks` ranks of the built-in decoder of `vocab`
    tokens, width `dim` and `heads` heads (ConfigError naming the field and the problem)."""
    schema = _SCHEMAS.get(op)
    if schema is None:
        raise ConfigError(f"unknown operation {op!r}")
    if not isinstance(payload, dict):
        raise ConfigError(f"{op}: the payload must be an object, got {type(payload).__name__}")
    context = {"vocab": vocab, "tp_split": _tp_split(vocab, dim, heads), "ranks": ranks}
    try:
        schema.model_validate(payload, context=context)
    except ValidationError as exc:
        raise ConfigError(f"{op}: {_say(exc)}") from None


@functools.lru_cache(maxsize=64)
def _tp_split(vocab: int, dim: int, heads: int) -> int:
    """What every tensor-parallel degree must divide: the decoder's split dimensions (its
    attention projections 3·dim and dim, its MLP's 4·dim, its vocabulary), and its heads."""
    return math.gcd(3 * dim, dim, 4 * dim, vocab, heads)


def _say(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:3]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "not a field of this operation"
        elif err["type"] == "missing":
            msg = "missing (this operation needs it)"
        parts.append(f"{where.lstrip('.') or 'payload'}: {msg}")
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
