"""What each operation of a deployment takes, checked against the model it runs: the service
refuses a bad payload at submission (400) and every rank checks it again before it computes,
so that a payload no rank can run fails on every rank alike, before any collective.

A payload is strict JSON: token ids are integers inside the vocabulary, a batch's rows are of
one length, a field that no operation of that kind reads is refused by name, never dropped.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from loom.core.errors import ConfigError
from loom.runtime.cluster.losses import Agg, LossKind

__all__ = ["FAULT_OP", "MAX_NEW_TOKENS", "check_payload"]

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
    """A loss over the rows (`losses`): which tokens count (`mask`, per predicted token:
    rows of len(ids[0]) - 1), the rows' advantages, and for PPO the log-probabilities of the
    policy that sampled them and the clip range [1 - clip, 1 + clip_high]."""

    loss: LossKind = LossKind.PG
    advantages: list[float] | None = None
    mask: list[list[Literal[0, 1]]] | None = None
    old_logprobs: list[list[float]] | None = None
    clip: float | None = Field(default=None, gt=0, lt=1)
    clip_high: float | None = Field(default=None, gt=0)
    agg: Agg = Agg.SEQUENCE

    @model_validator(mode="before")
    @classmethod
    def _enums(cls, data: Any) -> Any:
        # NOTE: strict mode takes enums only as instances; JSON gives their values
        if isinstance(data, dict):
            for key, enum in (("loss", LossKind), ("agg", Agg)):
                if isinstance(data.get(key), str):
                    try:
                        data = data | {key: enum(data[key])}
                    except ValueError:
                        known = ", ".join(e.value for e in enum)
                        raise ValueError(f"{key}: {data[key]!r} is not one of {known}") from None
        return data

    @model_validator(mode="after")
    def _fits(self) -> Self:
        rows, width = len(self.ids), len(self.ids[0]) - 1
        if self.advantages is not None:
            if len(self.advantages) != rows:
                raise ValueError(f"{len(self.advantages)} advantages for {rows} rows")
            if not all(math.isfinite(a) for a in self.advantages):
                raise ValueError("advantages must be finite numbers")
        for name in ("mask", "old_logprobs"):
            got = getattr(self, name)
            if got is None:
                continue
            if len(got) != rows:
                raise ValueError(f"{name}: {len(got)} rows for {rows} rows of ids")
            bad = next((i for i, r in enumerate(got) if len(r) != width), None)
            if bad is not None:
                raise ValueError(
                    f"{name}[{bad}]: {len(got[bad])} values; a row has one per predicted token "
                    f"({width}: len(ids[0]) - 1)"
                )
        if self.old_logprobs is not None and not all(
            math.isfinite(x) for r in self.old_logprobs for x in r
        ):
            raise ValueError("old_logprobs must be finite numbers")
        if self.mask is not None and self.agg is Agg.TOKEN and not any(map(any, self.mask)):
            raise ValueError("mask scores no token: the token mean has nothing to average")
        ppo = self.loss is LossKind.PPO
        if ppo and self.old_logprobs is None:
            raise ValueError("the ppo loss needs old_logprobs (the sampling policy's)")
        for name in ("old_logprobs", "clip", "clip_high"):
            if not ppo and getattr(self, name) is not None:
                raise ValueError(f"{name} is read by the ppo loss only, not {self.loss.value}")
        if self.loss is LossKind.NLL and self.advantages is not None:
            raise ValueError("advantages are not read by the nll loss")
        return self


class _OptimStep(_Payload):
    lr: float | None = Field(default=None, gt=0, le=1.0)
    max_grad_norm: float | None = Field(default=None, gt=0)


class _Generate(_Payload):
    ids: Ids
    max_tokens: int = Field(default=8, ge=1, le=MAX_NEW_TOKENS)

    @field_validator("ids")
    @classmethod
    def _ids(cls, v: list[list[int]], info: ValidationInfo) -> list[list[int]]:
        return _batch(v, info, min_len=1)


class _Checkpoint(_Payload):
    path: str = Field(min_length=1, max_length=4096)


_URL = r"^https?://[^\s/]+(/\S*)?$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"


class _Relay(_Payload):
    """Where the weights go: the relay (`loom serve relay`) they are published to, as a new
    version (sparse deltas against the one before, `loom.runtime.relay.model_sync`)."""

    url: str = Field(pattern=_URL, max_length=2048)
    job: str | None = Field(
        default=None, pattern=_NAME, max_length=128, description="whose weights, in the engines"
    )
    dense_every: int = Field(default=0, ge=0, description="a dense copy every N versions too")


class _Engine(_Payload):
    url: str = Field(pattern=_URL, max_length=2048)
    id: str | None = Field(default=None, pattern=_NAME, max_length=128)  # the router's name


class _SyncWeights(_Payload):
    tp: int | None = Field(default=None, ge=1, le=1024)
    relay: _Relay | None = None
    version: int | None = Field(default=None, ge=0, description="default: the step")
    engines: list[_Engine] | None = Field(default=None, max_length=1024)
    router: str | None = Field(default=None, pattern=_URL, max_length=2048)

    @field_validator("tp")
    @classmethod
    def _tp(cls, v: int | None, info: ValidationInfo) -> int | None:
        split = (info.context or {})["tp_split"]
        if v is not None and split is None:
            raise ValueError(
                "this model's tensor-parallel layout is unknown (its worker's param_specs "
                "gives none): sync it without tp"
            )
        if v is not None and split % v:
            raise ValueError(
                f"tp={v} does not split the model's sharded dimensions evenly (it must divide "
                f"{split})"
            )
        return v

    @model_validator(mode="after")
    def _needs(self) -> Self:
        if self.relay is None and (self.engines or self.router or self.version is not None):
            raise ValueError("engines, router and version go with a relay to publish to")
        if self.router is not None:
            if not self.engines:
                raise ValueError("router: name the engines it routes to (engines)")
            nameless = [e.url for e in self.engines if e.id is None]
            if nameless:
                raise ValueError(f"engines {nameless[:3]} need their router id (id)")
        return self


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


def check_payload(op: str, payload: Any, *, vocab: int, tp_split: int | None, ranks: int) -> None:
    """Refuse a payload `op` cannot run on `ranks` ranks of a model of `vocab` tokens whose
    tensor-parallel degrees must divide `tp_split` (None: it has no TP layout) — ConfigError
    naming the field and the problem."""
    schema = _SCHEMAS.get(op)
    if schema is None:
        raise ConfigError(f"unknown operation {op!r}")
    if not isinstance(payload, dict):
        raise ConfigError(f"{op}: the payload must be an object, got {type(payload).__name__}")
    context = {"vocab": vocab, "tp_split": tp_split, "ranks": ranks}
    try:
        schema.model_validate(payload, context=context)
    except ValidationError as exc:
        raise ConfigError(f"{op}: {_say(exc)}") from None


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
