"""Shard-aware transfer plans (ROSE §4.2): which slice of which training rank's local shard each
serving rank pulls, so no one gathers or pulls a full replica.

Training holds a model as TP × PP (× DP replicas, Megatron); serving as TP only (vLLM, PP = 1).
A plan cuts every parameter at both layouts' TP boundaries into pieces. Each piece lies in one
training TP shard and one serving TP shard (a replicated parameter is one piece that every
serving rank pulls), is published once, by one training rank, and pulled by the serving ranks
that need it, as through ROSE's relay (Mooncake Store; `Piece.key` is the object key).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from loom.core.errors import ConfigError
from loom.state.weights.codec import DENSE_THRESHOLD, encoded_nbytes
from loom.state.weights.params import ParamSpec

__all__ = [
    "Box",
    "Fetch",
    "Piece",
    "ServeLayout",
    "TrainLayout",
    "TrainRank",
    "TransferPlan",
    "plan_transfer",
    "shard_box",
    "stage_layers",
]


@dataclass(frozen=True, kw_only=True)
class TrainLayout:
    """Megatron layout: `tp` × `pp` ranks per replica, `dp` replicas holding the same weights."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        _check_sizes(self, "tp", "pp", "dp")

    def ranks(self) -> list[TrainRank]:
        """Every training rank, in (dp, pp, tp) order."""
        return [
            TrainRank(dp=d, pp=p, tp=t)
            for d in range(self.dp)
            for p in range(self.pp)
            for t in range(self.tp)
        ]


@dataclass(frozen=True, kw_only=True)
class ServeLayout:
    """vLLM layout of one serving instance: `tp` ranks, no pipeline stages."""

    tp: int = 1

    def __post_init__(self) -> None:
        _check_sizes(self, "tp")


def _check_sizes(layout: object, *names: str) -> None:
    for name in names:
        value = getattr(layout, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{type(layout).__name__}.{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True, order=True)
class TrainRank:
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class Box:
    """A hyper-rectangle `[lo, hi)` of a tensor's indices."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]

    @classmethod
    def full(cls, shape: Sequence[int]) -> Box:
        return cls((0,) * len(shape), tuple(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(h - lo for lo, h in zip(self.lo, self.hi, strict=True))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def slices(self) -> tuple[slice, ...]:
        """Index a numpy array or torch tensor with this: `x[box.slices]` is a view."""
        return tuple(slice(lo, h) for lo, h in zip(self.lo, self.hi, strict=True))

    def shifted(self, origin: Sequence[int]) -> Box:
        """This box in the coordinates of a shard that starts at `origin`."""
        return Box(
            tuple(a - o for a, o in zip(self.lo, origin, strict=True)),
            tuple(b - o for b, o in zip(self.hi, origin, strict=True)),
        )

    def split(self, dim: int, start: int, stop: int) -> Box:
        """This box restricted to `[start, stop)` along `dim`."""
        return Box(
            (*self.lo[:dim], start, *self.lo[dim + 1 :]),
            (*self.hi[:dim], stop, *self.hi[dim + 1 :]),
        )

    def __str__(self) -> str:
        return ",".join(f"{lo}:{h}" for lo, h in zip(self.lo, self.hi, strict=True))


@dataclass(frozen=True, kw_only=True)
class Piece:
    """One published object: a box of one parameter that one training rank sends, once."""

    param: ParamSpec
    box: Box  # in the full tensor
    src: TrainRank
    src_box: Box  # in `src`'s local shard of `param`

    @property
    def key(self) -> str:
        """Relay object key: the parameter and the box it covers, e.g. `lm_head.weight[0:9,0:4]`."""
        return f"{self.param.name}[{self.box}]"

    @property
    def numel(self) -> int:
        return self.box.numel

    def nbytes(
        self, changed_fraction: float | None = None, dense_threshold: float = DENSE_THRESHOLD
    ) -> int:
        """Bytes of its codec blob: dense without `changed_fraction`, else a delta with that
        fraction of its elements changed (rounded), dense above `dense_threshold`."""
        if changed_fraction is None:
            return encoded_nbytes(self.box.shape, None)
        if not 0.0 <= changed_fraction <= 1.0:
            raise ConfigError(f"changed_fraction must be in [0, 1], got {changed_fraction}")
        nnz = round(changed_fraction * self.numel)
        return encoded_nbytes(self.box.shape, nnz, dense_threshold=dense_threshold)


@dataclass(frozen=True, kw_only=True)
class Fetch:
    """A serving rank pulls `piece` and places it at `dst_box` of its local shard of the param."""

    piece: Piece
    dst_box: Box


@dataclass(frozen=True, kw_only=True)
class TransferPlan:
    """Every piece once, with its sending training rank, and each serving rank's fetches."""

    train: TrainLayout
    serve: ServeLayout
    params: tuple[ParamSpec, ...]
    pieces: tuple[Piece, ...]
    fetches: tuple[tuple[Fetch, ...], ...]  # indexed by serving TP rank
    _by_src: dict[TrainRank, tuple[Piece, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_src: dict[TrainRank, list[Piece]] = {rank: [] for rank in self.train.ranks()}
        for piece in self.pieces:
            by_src[piece.src].append(piece)
        object.__setattr__(self, "_by_src", {r: tuple(ps) for r, ps in by_src.items()})

    def pieces_from(self, rank: TrainRank) -> tuple[Piece, ...]:
        """What training rank `rank` publishes."""
        if rank not in self._by_src:
            raise ConfigError(f"{rank} is not a rank of {self.train}")
        return self._by_src[rank]

    def fetches_for(self, serve_rank: int) -> tuple[Fetch, ...]:
        """What serving TP rank `serve_rank` pulls."""
        if not 0 <= serve_rank < self.serve.tp:
            raise ConfigError(f"serving rank {serve_rank} is not in [0, {self.serve.tp})")
        return self.fetches[serve_rank]

    def sent_bytes(
        self, changed_fraction: float | None = None, dense_threshold: float = DENSE_THRESHOLD
    ) -> dict[TrainRank, int]:
        """Bytes each training rank publishes (`Piece.nbytes` summed; one blob per piece)."""
        return {
            rank: sum(p.nbytes(changed_fraction, dense_threshold) for p in pieces)
            for rank, pieces in self._by_src.items()
        }

    def pulled_bytes(
        self, changed_fraction: float | None = None, dense_threshold: float = DENSE_THRESHOLD
    ) -> dict[int, int]:
        """Bytes each serving TP rank pulls (`Piece.nbytes` over its fetches)."""
        return {
            r: sum(f.piece.nbytes(changed_fraction, dense_threshold) for f in fetches)
            for r, fetches in enumerate(self.fetches)
        }


def stage_layers(num_layers: int, pp: int) -> tuple[range, ...]:
    """Contiguous decoder-layer ranges of the `pp` stages, as even as possible: the first
    `num_layers mod pp` stages take one layer more."""
    if pp > num_layers:
        raise ConfigError(f"pp={pp} needs at least {pp} decoder layers, the model has {num_layers}")
    base, extra = divmod(num_layers, pp)
    bounds = [0]
    for s in range(pp):
        bounds.append(bounds[-1] + base + (s < extra))
    return tuple(range(a, b) for a, b in itertools.pairwise(bounds))


def shard_box(param: ParamSpec, tp: int, rank: int) -> Box:
    """The box of `param`'s full tensor that TP rank `rank` of `tp` holds."""
    full = Box.full(param.shape)
    dim = param.rule.dim
    if dim is None:
        return full
    step = _step(param, tp)
    return full.split(dim, rank * step, (rank + 1) * step)


def _step(param: ParamSpec, tp: int) -> int:
    dim = param.rule.dim
    assert dim is not None, f"{param.name} is replicated"
    size = param.shape[dim]
    if size % tp:
        raise ConfigError(
            f"{param.name}: dim {dim} of shape {param.shape} ({param.rule}-parallel) "
            f"does not split evenly over tp={tp}"
        )
    return size // tp


def plan_transfer(
    params: Iterable[ParamSpec],
    train: TrainLayout,
    serve: ServeLayout,
    *,
    max_piece_bytes: int | None = None,
) -> TransferPlan:
    """The transfer plan from `train` to `serve` of `params`.

    Pieces larger than `max_piece_bytes` (bf16) are cut into row blocks (dim 0), so DP ranks
    share big shards and a piece fits a relay bucket. Each piece goes to one eligible training
    rank, the one of its pipeline stage holding its data (the owning TP rank, any for a
    replicated param; any DP replica) that has published the fewest bytes so far (dense blob
    bytes), largest pieces first (greedy LPT). So within each (pp, tp) group the DP ranks'
    dense loads differ by at most the largest piece of that stage; a uniform changed fraction
    scales every piece alike, so sparse loads stay about as balanced.
    """
    params = tuple(params)
    if max_piece_bytes is not None and max_piece_bytes < 1:
        raise ConfigError(f"max_piece_bytes must be >= 1 or None, got {max_piece_bytes}")
    _check_names(params)
    stages = _stages(params, train.pp)
    cuts = [c for p in params for c in _cuts(p, train.tp, serve.tp, max_piece_bytes)]
    sources = _assign(cuts, stages, train)
    pieces: list[Piece] = []
    fetches: list[list[Fetch]] = [[] for _ in range(serve.tp)]
    for cut, src in zip(cuts, sources, strict=True):
        piece = Piece(
            param=cut.param,
            box=cut.box,
            src=src,
            src_box=cut.box.shifted(shard_box(cut.param, train.tp, src.tp).lo),
        )
        pieces.append(piece)
        for r in cut.dst_ranks:
            dst_origin = shard_box(cut.param, serve.tp, r).lo
            fetches[r].append(Fetch(piece=piece, dst_box=cut.box.shifted(dst_origin)))
    return TransferPlan(
        train=train,
        serve=serve,
        params=params,
        pieces=tuple(pieces),
        fetches=tuple(tuple(f) for f in fetches),
    )


@dataclass(frozen=True)
class _Cut:
    param: ParamSpec
    box: Box
    src_tp: int | None  # None: replicated, any TP rank holds it
    dst_ranks: tuple[int, ...]


def _cuts(
    param: ParamSpec, train_tp: int, serve_tp: int, max_piece_bytes: int | None
) -> list[_Cut]:
    """`param` cut at both layouts' TP boundaries, then into row blocks of `max_piece_bytes`."""
    full = Box.full(param.shape)
    dim = param.rule.dim
    if dim is None:
        cuts = [_Cut(param, full, None, tuple(range(serve_tp)))]
    else:
        t_step, s_step = _step(param, train_tp), _step(param, serve_tp)
        edges = sorted(
            {*range(0, param.shape[dim] + 1, t_step), *range(0, param.shape[dim] + 1, s_step)}
        )
        cuts = [
            _Cut(param, full.split(dim, a, b), a // t_step, (a // s_step,))
            for a, b in itertools.pairwise(edges)
        ]
    if max_piece_bytes is None:
        return cuts
    return [c for cut in cuts for c in _row_blocks(cut, max_piece_bytes)]


def _row_blocks(cut: _Cut, max_piece_bytes: int) -> list[_Cut]:
    rows = cut.box.shape[0]
    row_bytes = 2 * cut.box.numel // rows
    step = max(1, max_piece_bytes // row_bytes)
    lo, hi = cut.box.lo[0], cut.box.hi[0]
    return [
        _Cut(cut.param, cut.box.split(0, a, min(a + step, hi)), cut.src_tp, cut.dst_ranks)
        for a in range(lo, hi, step)
    ]


def _assign(cuts: list[_Cut], stages: dict[str, int], train: TrainLayout) -> list[TrainRank]:
    """Each cut's sending rank: greedy LPT over its eligible ranks (see `plan_transfer`)."""
    load: dict[TrainRank, int] = defaultdict(int)
    sources: list[TrainRank | None] = [None] * len(cuts)
    size = [encoded_nbytes(cut.box.shape, None) for cut in cuts]  # dense blob, header included
    for i in sorted(range(len(cuts)), key=lambda i: (-size[i], i)):
        cut = cuts[i]
        pp = stages[cut.param.name]
        tps = range(train.tp) if cut.src_tp is None else (cut.src_tp,)
        eligible = (TrainRank(dp=d, pp=pp, tp=t) for d in range(train.dp) for t in tps)
        src = min(eligible, key=lambda r: (load[r], r))
        load[src] += size[i]
        sources[i] = src
    assert all(s is not None for s in sources), "every cut has a source"
    return [s for s in sources if s is not None]


def _stages(params: tuple[ParamSpec, ...], pp: int) -> dict[str, int]:
    """Pipeline stage of each param: its layer's stage; the embedding on the first stage,
    anything else outside the layers (final norm, LM head) on the last."""
    layers = [p.layer for p in params if p.layer is not None]
    num_layers = max(layers) + 1 if layers else 0
    stage_of_layer = (
        {layer: s for s, rng in enumerate(stage_layers(num_layers, pp)) for layer in rng}
        if pp > 1
        else {}
    )
    stages = {}
    for p in params:
        if p.layer is not None:
            stages[p.name] = stage_of_layer.get(p.layer, 0)
        else:
            stages[p.name] = 0 if "embed_tokens" in p.name else pp - 1
    return stages


def _check_names(params: tuple[ParamSpec, ...]) -> None:
    seen: set[str] = set()
    for p in params:
        if p.name in seen:
            raise ConfigError(f"parameter {p.name} appears twice")
        seen.add(p.name)
    if not params:
        raise ConfigError("no parameters to plan")
