"""ROSE Fig. 10 as a time model: a weight transfer takes as long as its slowest sender bound
(one relay put stream, one training node, the shared cross-cluster link) plus the serving ranks'
pulls of 1 GiB batches, pipelined behind the pushes or after them; bytes come from Loom's shard
planner and sparse-delta codec.

Setup (§6.3): 16 training and 16 serving GPUs (8-GPU nodes, an assumption) joined by one
Ethernet link of `bandwidth_gbps` (200 unless swept), shared by every cross-cluster stream at a
TCP goodput of 0.94. Training (TP, PP, CP) is (4, 1, 1) for Qwen3-8B and (8, 1, 2) for
Qwen3-32B; CP ranks hold the same weights as DP replicas. Serving is TP1 (8B) and TP4 (32B).
The relay lives in the serving cluster: only pushes cross the link (Fig. 10b's 8B shard time at
1 Gbps, 109 s, rules out pulls crossing it: 16 TP1 replicas of 16.4 GB would take > 2,000 s).

Variants, each adding to the previous one (`FEATURES`):

- batch: one rank all-gathers the model over NVLink, pushes it as one stream of 64 MiB puts,
  then every serving rank pulls a full replica and loads it.
- async: the same stream, but serving ranks pull each 1 GiB batch as soon as it is published.
- shard: every training rank pushes its own pieces of `plan_transfer` (DP/CP replicas send
  disjoint sets), every serving rank pulls only its fetches.
- sparse: each piece ships as the codec's delta blob; D2S before a put, S2D after a pull.

Sender time is the largest of three bounds: the slowest stream (per 64 MiB put, `put_fixed_s`
+ bytes at the App. F put rate, + D2S), the busiest training node (bytes at a per-node push
rate) and the link (all bytes). Receiver time walks each serving rank's batches: a batch is
pullable once pushed (uniform progress) and costs its bytes at a per-rank pull-and-load rate,
a few ms per bucket, and S2D when sparse.

Calibration: only App. F's Qwen3-32B shard-aware timeline at 200 Gbps. A 64 MiB put takes
0.3 s (the put rate); 65 s to push 4.1 GB per worker (the per-node rate: puts alone would take
18 s, so 8 workers per node share a node-wide limit); 42 s to pull and load 16.4 GB per serving
rank (the pull rate). The bytes for these rates are Loom's own plan for that configuration. All
else is stated in `perf/data/rose_transfer.toml` with its source; the paper's ratios and the
other Fig. 10b points are compared against, never fitted to.

What comes out (seed 0; other seeds and the full sample move sparse times < 0.5%; the paper's
times at 200 Gbps are Fig. 10b's endpoints, its speedups §6.3's; x = over the previous variant):

    Qwen3-8B    batch 115.3 s  async 75.5 s (1.53x)  shard 43.1 s (1.75x)  sparse 8.4 s (5.15x)
                total 13.8x;   paper 1.6x, 1.8x, 4.4x, total 12.4x (shard 31 s, sparse 7 s)
    Qwen3-32B   batch 461.2 s  async 295.9 s (1.56x) shard 67.4 s (4.39x)  sparse 12.6 s (5.34x)
                total 36.6x;   paper 1.5x, 1.3x, 4.6x, total 9.1x (shard 96 s, sparse 21 s)
    Fig. 10b    (200 -> 1 Gbps) 8B shard 43 -> 141 s (paper 31 -> 109), sparse 8.4 -> 22 s
                (paper 7 -> 39); 32B shard 67 -> 558 s (paper 96 -> 584), sparse 12.6 -> 85 s
                (paper 21 -> 89). Sparse over shard: 8B 5.1-6.3x (paper 2.8-4.4x), 32B 5.3-6.6x
                (paper 4.6-6.6x). At 5 Gbps sparse takes 9.1 s (8B) and 18.7 s (32B); the paper
                says within 10 s and 30 s.

Where it agrees: batch -> async (1.53x, 1.56x; paper 1.6x, 1.5x), 8B async -> shard (1.75x;
paper 1.8x), 8B in total (13.8x; paper 12.4x), 32B shard and sparse at 1 Gbps (558 s, 85 s;
paper 584 s, 89 s), the 5 Gbps bounds. Where it misses, and why:

- 32B async -> shard 4.39x (paper 1.3x), so 32B total 36.6x (paper 9.1x), batch 461 s (paper
  ~190 s). batch and async push 65.5 GB down one stream at App. F's put rate (64 MiB per 0.3 s,
  226 MB/s): 293 s. The paper's implied async time (96 s x 1.3 = ~125 s) needs that stream at
  ~0.5 GB/s: App. F's 0.3 s per put was measured with 16 workers pushing at once and understates
  one uncontended stream (Fig. 3d agrees if its largest model, 145 s over InfiniBand for the
  batch path, is Qwen3-32B or larger). Batch also pulls a full 65.5 GB replica into each of 16
  serving ranks, 168 s at App. F's pull rate, measured on sliced shard pulls.
- 32B shard 67 s (paper 96 s): pulls overlap pushes once the first 1 GiB batch is out, so it is
  65 s of pushes plus the last batch; App. F's timeline (65 s push, 42 s pull, 96 s in all)
  overlaps them by only ~11 s.
- 8B shard 43 s (paper 31 s): a TP1 serving rank pulls the whole 16.4 GB, as much as a 32B TP4
  rank, which App. F's pull rate makes 42 s; shard-awareness cannot shrink a TP1 rank's pull.
- 8B shard at 1 Gbps 141 s (paper 109 s): 16.4 GB cannot cross one 1 Gbps link in 109 s (131 s
  at full line rate); that point implies more capacity than one link (one throttled NIC per
  node, say), while the 32B point (584 s for 65.5 GB) fits one link.
- sparse step 5.2x and 5.3x (paper 4.4x, 4.6x); 32B sparse 12.6 s (paper 21 s), 8B sparse at
  1 Gbps 22 s (paper 39 s): nothing per step is modelled beyond a few ms per bucket, and §4.2's
  ~1 s bound on applying keeps S2D small. With Fig. 11a's ~1% non-zeros (8B) instead of Fig. 6's
  5% bound, 8B sparse takes 2.7 s at 200 Gbps and 6.4 s at 1 Gbps (32B: 4.2 s, 18.9 s); 39 s at
  1 Gbps would need ~4.6 GB on the wire, more than 1% non-zeros give (0.49 GB).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from loom.core.errors import ConfigError
from loom.experiments.report import Record
from loom.perf.specs import gpu_spec
from loom.state.weights import (
    ServeLayout,
    TrainLayout,
    TransferPlan,
    encode,
    encoded_nbytes,
    float32_to_bf16_bits,
    header_nbytes,
    model_params,
    plan_transfer,
)

__all__ = [
    "BANDWIDTHS_GBPS",
    "FEATURES",
    "CodecSample",
    "Estimate",
    "Features",
    "Pull",
    "Rates",
    "Relay",
    "Stream",
    "TransferSetup",
    "Variant",
    "Volumes",
    "codec_sample",
    "delta_pair",
    "estimate",
    "fig10_records",
    "rates",
    "relay",
    "transfer_plan",
    "transfer_setup",
    "transfer_time_s",
    "volumes",
]

BANDWIDTHS_GBPS = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)  # Fig. 10b's sweep
MIB = 1 << 20
# Rows of each sampled layer-0 tensor the codec encodes; quick runs and `transfer_time_s` use
# the small sample (sparse bytes move by < 0.5% across seeds and sample sizes).
SAMPLE_ROWS = {True: 128, False: 1024}


class Variant(StrEnum):
    BATCH = "batch"
    ASYNC = "async"
    SHARD = "shard"
    SPARSE = "sparse"


@dataclass(frozen=True)
class Features:
    """What a variant does; each variant adds one feature to the previous one (§6.3)."""

    pipelined: bool  # pulls follow pushes batch by batch instead of after the whole push
    sharded: bool  # each training rank pushes its pieces, each serving rank pulls its fetches
    sparse: bool  # pieces ship as sparse-delta blobs (dense above the codec's threshold)


FEATURES: dict[Variant, Features] = {
    Variant.BATCH: Features(pipelined=False, sharded=False, sparse=False),
    Variant.ASYNC: Features(pipelined=True, sharded=False, sparse=False),
    Variant.SHARD: Features(pipelined=True, sharded=True, sparse=False),
    Variant.SPARSE: Features(pipelined=True, sharded=True, sparse=True),
}


# --- sourced numbers (perf/data/rose_transfer.toml) ---------------------------------------------


@cache
def _data() -> dict[str, Any]:
    path = resources.files("loom.perf").joinpath("data").joinpath("rose_transfer.toml")
    with path.open("rb") as fh:
        return tomllib.load(fh)


def _table(*path: str) -> dict[str, Any]:
    table: dict[str, Any] = _data()
    for part in path:
        table = table[part]
    if "source" not in table:
        raise ConfigError(f"rose_transfer.toml [{'.'.join(path)}] has no source")
    return {
        k: v["value"] if isinstance(v, dict) and "value" in v else v
        for k, v in table.items()
        if k != "source"
    }


def _models() -> tuple[str, ...]:
    return tuple(_data()["layouts"])


@dataclass(frozen=True, kw_only=True)
class TransferSetup:
    """One model's §6.3 deployment: training and serving layouts on 8-GPU nodes."""

    model: str
    train: TrainLayout  # dp counts CP ranks too: they hold the same weights
    serve: ServeLayout
    train_gpus: int
    serve_gpus: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        per_replica = self.train.tp * self.train.pp
        if self.train_gpus != per_replica * self.train.dp:
            raise ConfigError(f"{self.model}: {self.train} does not fill {self.train_gpus} GPUs")
        if self.serve_gpus % self.serve.tp:
            raise ConfigError(f"{self.model}: serving TP{self.serve.tp} does not divide GPUs")


@cache
def transfer_setup(model: str) -> TransferSetup:
    """The §6.3 setup of `model` (`qwen3-8b` or `qwen3-32b`)."""
    if model not in _models():
        raise ConfigError(
            f"unknown model {model!r} for ROSE's transfer setup; known: {', '.join(_models())}"
        )
    cluster, lay = _table("cluster"), _table("layouts", model)
    train_gpus = int(cluster["train_gpus"])
    tp, pp, cp = int(lay["train_tp"]), int(lay["train_pp"]), int(lay["train_cp"])
    if train_gpus % (tp * pp):
        raise ConfigError(f"{model}: TP{tp} x PP{pp} does not divide {train_gpus} GPUs")
    replicas = train_gpus // (tp * pp)  # DP x CP
    if replicas % cp:
        raise ConfigError(f"{model}: CP{cp} does not divide {replicas} replicas")
    return TransferSetup(
        model=model,
        train=TrainLayout(tp=tp, pp=pp, dp=replicas),
        serve=ServeLayout(tp=int(lay["serve_tp"])),
        train_gpus=train_gpus,
        serve_gpus=int(cluster["serve_gpus"]),
        gpus_per_node=int(cluster["gpus_per_node"]),
    )


@dataclass(frozen=True, kw_only=True)
class Relay:
    """Fixed costs and sizes of the relay path (§4.2, App. F) and the link's goodput."""

    bucket_bytes: int
    pull_batch_bytes: int
    put_bucket_s: float  # one dense bucket's put
    put_fixed_s: float  # per put, whatever its size
    pull_fixed_s: float  # per bucket pulled
    d2s_bucket_s: float  # dense-to-sparse, per 64 MiB of dense weights
    s2d_bucket_s: float  # sparse-to-dense, per 64 MiB of dense weights
    tcp_goodput: float  # payload share of the link's bits
    nvlink_bytes_s: float  # all-gather inside a training node

    def link_bytes_s(self, bandwidth_gbps: float) -> float:
        return bandwidth_gbps * 1e9 / 8 * self.tcp_goodput


@cache
def relay() -> Relay:
    r, cluster = _table("relay"), _table("cluster")
    return Relay(
        bucket_bytes=int(r["bucket_mib"]) * MIB,
        pull_batch_bytes=int(r["pull_batch_mib"]) * MIB,
        put_bucket_s=float(r["put_bucket_s"]),
        put_fixed_s=float(r["put_fixed_s"]),
        pull_fixed_s=float(r["pull_fixed_s"]),
        d2s_bucket_s=float(r["d2s_bucket_s"]),
        s2d_bucket_s=float(r["s2d_bucket_s"]),
        tcp_goodput=float(cluster["tcp_goodput"]),
        nvlink_bytes_s=gpu_spec(str(cluster["nvlink_gpu"])).nvlink_gbs * 1e9,
    )


def _default_nnz() -> float:
    return float(_table("delta")["nnz_fraction"])


# --- bytes: the codec on sampled tensors, the planner for element counts -----------------------


def delta_pair(
    shape: tuple[int, ...], nnz_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """bf16 bits of N(0, 0.02) weights `old`, and `new` with each element changed with
    probability `nnz_fraction` (its low mantissa bits flipped, so it really differs)."""
    numel = math.prod(shape)
    old = float32_to_bf16_bits(rng.standard_normal(numel, dtype=np.float32) * np.float32(0.02))
    changed = rng.random(numel, dtype=np.float32) < nnz_fraction
    new = old.copy()
    new[changed] ^= rng.integers(1, 0x80, size=int(changed.sum()), dtype=np.uint16)
    return old.reshape(shape), new.reshape(shape)


@dataclass(frozen=True, kw_only=True)
class CodecSample:
    """What the codec wrote for sampled tensors: the bytes every estimate scales from."""

    nnz_fraction: float
    shapes: tuple[tuple[int, ...], ...]
    numel: int
    header_nbytes: int  # of the sampled blobs
    encoded_nbytes: int  # sum of len(encode(new, old=old, ...)) over the samples

    @property
    def payload_per_element(self) -> float:
        """Blob bytes beyond the header per element: ~6 x nnz_fraction sparse, 2 when dense."""
        return (self.encoded_nbytes - self.header_nbytes) / self.numel

    def blob_nbytes(self, shape: tuple[int, ...]) -> int:
        """Estimated blob size of a piece of `shape`: its header plus the sampled payload rate."""
        return header_nbytes(len(shape)) + round(self.payload_per_element * math.prod(shape))


@cache
def codec_sample(model: str, nnz_fraction: float, *, seed: int, rows: int) -> CodecSample:
    """Encode the first `rows` rows of each of `model`'s layer-0 tensors as deltas with
    `nnz_fraction` of the elements changed (seeded), with Loom's real codec."""
    transfer_setup(model)
    rng = np.random.default_rng(seed)
    shapes = tuple(
        (min(rows, p.shape[0]), *p.shape[1:]) for p in model_params(model) if p.layer == 0
    )
    encoded = 0
    for shape in shapes:
        old, new = delta_pair(shape, nnz_fraction, rng)
        encoded += len(encode(new, old=old, version=1, base_version=0))
    return CodecSample(
        nnz_fraction=nnz_fraction,
        shapes=shapes,
        numel=sum(math.prod(s) for s in shapes),
        header_nbytes=sum(header_nbytes(len(s)) for s in shapes),
        encoded_nbytes=encoded,
    )


@dataclass(frozen=True, kw_only=True)
class Stream:
    """One sender: a training rank (or the gathering rank) pushing its bytes in order."""

    node: int
    sent_bytes: int
    dense_bytes: int  # dense weights it covers: one put (and one D2S) per 64 MiB of them


@dataclass(frozen=True, kw_only=True)
class Pull:
    """One serving rank's pulls (every serving instance is alike)."""

    pulled_bytes: int
    dense_bytes: int  # dense weights its pulls cover (S2D passes)


@dataclass(frozen=True, kw_only=True)
class Volumes:
    """Bytes a variant moves: senders, one instance's serving ranks, the all-gather."""

    streams: tuple[Stream, ...]
    pulls: tuple[Pull, ...]
    gather_bytes: int  # received by the gathering rank (0 when shard-aware)

    @property
    def bytes_sent(self) -> int:
        """Bytes over the cross-cluster link."""
        return sum(s.sent_bytes for s in self.streams)


@cache
def transfer_plan(model: str) -> TransferPlan:
    """Loom's shard plan for `model`'s §6.3 layouts, pieces cut to at most one 64 MiB bucket."""
    s = transfer_setup(model)
    return plan_transfer(
        model_params(model), s.train, s.serve, max_piece_bytes=relay().bucket_bytes
    )


def volumes(setup: TransferSetup, features: Features, sample: CodecSample | None) -> Volumes:
    """Bytes of a variant: `sample` sizes the sparse blobs (required when `features.sparse`)."""
    if features.sharded:
        return _shard_volumes(setup, sample if features.sparse else None)
    assert not features.sparse, "sparse transfer is shard-aware (variants are additive)"
    return _replica_volumes(setup)


def _replica_volumes(setup: TransferSetup) -> Volumes:
    params = model_params(setup.model)
    full = sum(encoded_nbytes(p.shape, None) for p in params)
    own = full // (setup.train.tp * setup.train.pp)
    return Volumes(
        streams=(Stream(node=0, sent_bytes=full, dense_bytes=full),),
        pulls=tuple(Pull(pulled_bytes=full, dense_bytes=full) for _ in range(setup.serve.tp)),
        gather_bytes=full - own,
    )


def _shard_volumes(setup: TransferSetup, sample: CodecSample | None) -> Volumes:
    plan = transfer_plan(setup.model)

    def sent(shape: tuple[int, ...]) -> int:
        return encoded_nbytes(shape, None) if sample is None else sample.blob_nbytes(shape)

    streams = []
    for i, rank in enumerate(setup.train.ranks()):
        pieces = plan.pieces_from(rank)
        streams.append(
            Stream(
                node=i // setup.gpus_per_node,
                sent_bytes=sum(sent(p.box.shape) for p in pieces),
                dense_bytes=sum(p.nbytes() for p in pieces),
            )
        )
    pulls = tuple(
        Pull(
            pulled_bytes=sum(sent(f.piece.box.shape) for f in fetches),
            dense_bytes=sum(f.piece.nbytes() for f in fetches),
        )
        for fetches in plan.fetches
    )
    return Volumes(streams=tuple(streams), pulls=pulls, gather_bytes=0)


# --- calibration: App. F's Qwen3-32B shard-aware timeline ----------------------------------------


@dataclass(frozen=True, kw_only=True)
class Rates:
    """Throughputs calibrated to App. F (bytes per second)."""

    put_stream: float  # one sender's puts
    push_node: float  # all the pushes from one training node together
    pull_rank: float  # one serving rank's pulls and GPU loads


@cache
def rates() -> Rates:
    """Rates from App. F's 32B shard-aware timeline and Loom's plan bytes for it: a 64 MiB put
    in 0.3 s, 65 s to push every worker's shard, 42 s to pull and load each serving shard."""
    cal, r = _table("calibration"), relay()
    setup = transfer_setup(str(cal["model"]))
    vol = _shard_volumes(setup, None)
    put_stream = r.bucket_bytes / (r.put_bucket_s - r.put_fixed_s)
    push_s, pull_s = float(cal["push_total_s"]), float(cal["pull_total_s"])
    assert max(_stream_s(s, r, put_stream, False) for s in vol.streams) < push_s, (
        "App. F: puts alone must take less than the 65 s push, else no node-wide limit is implied"
    )
    pull = max(vol.pulls, key=lambda p: p.pulled_bytes)
    fixed = r.pull_fixed_s * math.ceil(pull.pulled_bytes / r.bucket_bytes)
    return Rates(
        put_stream=put_stream,
        push_node=max(_node_bytes(vol.streams).values()) / push_s,
        pull_rank=pull.pulled_bytes / (pull_s - fixed),
    )


# --- time ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """One transfer's modelled time and bytes."""

    model: str
    variant: Variant
    bandwidth_gbps: float
    nnz_fraction: float | None  # None unless sparse
    transfer_s: float  # first push (or all-gather) to the last serving rank's last load
    gather_s: float
    push_s: float
    push_bound: str  # "stream", "node" or "link": what sets push_s
    pull_s: float  # the slowest serving rank's busy time pulling, loading and applying
    bytes_sent: int  # over the cross-cluster link
    bytes_pulled_per_rank: int  # the largest


def _node_bytes(streams: Iterable[Stream]) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in streams:
        out[s.node] = out.get(s.node, 0) + s.sent_bytes
    return out


def _stream_s(s: Stream, r: Relay, put_stream: float, sparse: bool) -> float:
    puts = math.ceil(s.dense_bytes / r.bucket_bytes)
    return puts * (r.put_fixed_s + (r.d2s_bucket_s if sparse else 0.0)) + s.sent_bytes / put_stream


def _push(vol: Volumes, sparse: bool, bandwidth_gbps: float) -> tuple[float, str]:
    """Seconds to publish everything: the largest of the stream, node and link bounds."""
    r, k = relay(), rates()
    bounds = {
        "stream": max(_stream_s(s, r, k.put_stream, sparse) for s in vol.streams),
        "node": max(_node_bytes(vol.streams).values()) / k.push_node,
        "link": vol.bytes_sent / r.link_bytes_s(bandwidth_gbps),
    }
    bound = max(bounds, key=lambda b: bounds[b])
    return bounds[bound], bound


def _pull_done_s(
    pull: Pull, *, start_s: float, push_s: float, pipelined: bool, sparse: bool
) -> tuple[float, float]:
    """When one serving rank has everything loaded, and its busy time: it pulls 1 GiB batches
    in order, each once published (pushes progress uniformly) or, unpipelined, after them all."""
    r, k = relay(), rates()
    t, busy, done = start_s, 0.0, 0
    while done < pull.pulled_bytes:
        size = min(r.pull_batch_bytes, pull.pulled_bytes - done)
        done += size
        ready = start_s + push_s * (done / pull.pulled_bytes if pipelined else 1.0)
        cost = r.pull_fixed_s * math.ceil(size / r.bucket_bytes) + size / k.pull_rank
        if sparse:
            dense = pull.dense_bytes * size / pull.pulled_bytes
            cost += r.s2d_bucket_s * dense / r.bucket_bytes
        t = max(t, ready) + cost
        busy += cost
    return t, busy


def _check_bandwidth(bandwidth_gbps: float) -> float:
    if not (isinstance(bandwidth_gbps, int | float) and math.isfinite(bandwidth_gbps)):
        raise ConfigError(f"bandwidth_gbps must be a finite number, got {bandwidth_gbps!r}")
    if bandwidth_gbps <= 0:
        raise ConfigError(f"bandwidth_gbps must be > 0, got {bandwidth_gbps}")
    return float(bandwidth_gbps)


def _variant(variant: Variant | str) -> Variant:
    try:
        return Variant(variant)
    except ValueError:
        known = ", ".join(v.value for v in Variant)
        raise ConfigError(f"unknown transfer variant {variant!r}; known: {known}") from None


def _nnz(nnz_fraction: float | None) -> float:
    nnz = _default_nnz() if nnz_fraction is None else nnz_fraction
    if not (isinstance(nnz, int | float) and 0.0 <= nnz <= 1.0):
        raise ConfigError(f"nnz_fraction must be in [0, 1], got {nnz!r}")
    return float(nnz)


def estimate(
    model: str,
    variant: Variant | str,
    *,
    bandwidth_gbps: float = 200.0,
    nnz_fraction: float | None = None,
    seed: int = 0,
    quick: bool = True,
) -> Estimate:
    """Modelled transfer of `model`'s weights from training to serving with `variant`.

    `nnz_fraction` is the delta's changed fraction (sparse only; default the toml's 5%); `seed`
    draws the sampled deltas the codec encodes, `quick` samples fewer rows of them."""
    setup, var = transfer_setup(model), _variant(variant)
    bandwidth_gbps = _check_bandwidth(bandwidth_gbps)
    nnz = _nnz(nnz_fraction)
    features = FEATURES[var]
    sample = (
        codec_sample(model, nnz, seed=seed, rows=SAMPLE_ROWS[quick]) if features.sparse else None
    )
    vol = volumes(setup, features, sample)
    gather_s = vol.gather_bytes / relay().nvlink_bytes_s
    push_s, bound = _push(vol, features.sparse, bandwidth_gbps)
    done = [
        _pull_done_s(
            p, start_s=gather_s, push_s=push_s, pipelined=features.pipelined, sparse=features.sparse
        )
        for p in vol.pulls
    ]
    return Estimate(
        model=model,
        variant=var,
        bandwidth_gbps=bandwidth_gbps,
        nnz_fraction=nnz if features.sparse else None,
        transfer_s=max(t for t, _ in done),
        gather_s=gather_s,
        push_s=push_s,
        push_bound=bound,
        pull_s=max(b for _, b in done),
        bytes_sent=vol.bytes_sent,
        bytes_pulled_per_rank=max(p.pulled_bytes for p in vol.pulls),
    )


def transfer_time_s(
    model: str,
    variant: Variant | str,
    *,
    bandwidth_gbps: float = 200.0,
    nnz_fraction: float | None = None,
) -> float:
    """Seconds to move one step's weights of `model` from training to serving (§6.3 setup)."""
    return estimate(
        model, variant, bandwidth_gbps=bandwidth_gbps, nnz_fraction=nnz_fraction
    ).transfer_s


# --- Fig. 10 records -----------------------------------------------------------------------------


def _paper_speedups(model: str) -> dict[Variant, tuple[float, float]]:
    """(over the previous variant, over batch) per variant, from §6.3's stated ratios."""
    p = _table("paper", "fig10a")[model]
    step = {Variant.BATCH: 1.0, Variant.ASYNC: p["async"], Variant.SHARD: p["shard"]}
    step[Variant.SPARSE] = p["sparse"]
    cumulative = {
        Variant.BATCH: 1.0,
        Variant.ASYNC: p["async"],
        Variant.SHARD: p["async"] * p["shard"],
        Variant.SPARSE: p["total"],  # NOTE: stated; 1.6 x 1.8 x 4.4 would be 12.7 for 8B
    }
    return {v: (float(step[v]), float(cumulative[v])) for v in Variant}


def _paper_seconds(model: str, variant: Variant, bandwidth_gbps: float) -> float | None:
    points = _table("paper", "fig10b")[model].get(variant.value, {})
    value = points.get(f"{bandwidth_gbps:g}")
    return None if value is None else float(value)


def _fig10a(seed: int, quick: bool) -> list[Record]:
    rows: list[Record] = []
    for model in _models():
        paper = _paper_speedups(model)
        est = {v: estimate(model, v, seed=seed, quick=quick) for v in Variant}
        order = list(Variant)
        for i, v in enumerate(order):
            e = est[v]
            prev = est[order[i - 1]] if i else e
            rows.append(
                {
                    "experiment": "fig10",
                    "model": model,
                    "policy": v.value,
                    "bandwidth_gbps": e.bandwidth_gbps,
                    "nnz_fraction": e.nnz_fraction,
                    "transfer_s": e.transfer_s,
                    "push_s": e.push_s,
                    "push_bound": e.push_bound,
                    "pull_s": e.pull_s,
                    "bytes_sent": e.bytes_sent,
                    "bytes_pulled_per_rank": e.bytes_pulled_per_rank,
                    "speedup_vs_prev": prev.transfer_s / e.transfer_s,
                    "speedup_vs_batch": est[Variant.BATCH].transfer_s / e.transfer_s,
                    "paper_speedup_vs_prev": paper[v][0],
                    "paper_speedup": paper[v][1],
                    "paper_transfer_s": _paper_seconds(model, v, e.bandwidth_gbps),
                }
            )
    return rows


def _fig10b(seed: int, quick: bool, bandwidths: Sequence[float]) -> list[Record]:
    rows: list[Record] = []
    for model in _models():
        for v in (Variant.SHARD, Variant.SPARSE):
            for bw in bandwidths:
                e = estimate(model, v, bandwidth_gbps=bw, seed=seed, quick=quick)
                rows.append(
                    {
                        "experiment": "fig10b",
                        "model": model,
                        "policy": v.value,
                        "bandwidth_gbps": bw,
                        "transfer_s": e.transfer_s,
                        "push_bound": e.push_bound,
                        "bytes_sent": e.bytes_sent,
                        "paper_transfer_s": _paper_seconds(model, v, bw),
                    }
                )
    return rows


def fig10_records(seed: int, quick: bool) -> list[Record]:
    """Fig. 10a (each variant at 200 Gbps, both models) and Fig. 10b (shard and sparse over the
    bandwidth sweep) as tidy records; `seed` draws the sampled deltas the codec encodes."""
    return _fig10a(seed, quick) + _fig10b(seed, quick, BANDWIDTHS_GBPS)
