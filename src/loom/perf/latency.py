"""Seconds per continuous-batching iteration of an inference worker: roofline or fitted profile."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
from scipy.optimize import nnls

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.perf.specs import Calibration, GpuSpec, ModelSpec, gpu_spec, load_calibration, model_spec

__all__ = [
    "LatencyModel",
    "ProfileRow",
    "ProfiledLatencyModel",
    "RooflineLatencyModel",
    "sample_profile",
    "save_profile",
]


class LatencyModel(Protocol):
    """Latency of one engine iteration on one worker of `tp` GPUs (`num_gpus == tp`)."""

    @property
    def tp(self) -> int: ...

    @property
    def num_gpus(self) -> int: ...

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit beside the weights, >= 0."""
        ...

    def iteration_time(
        self,
        decode_batch: int,
        decode_context: int,
        prefill_tokens: int = 0,
        prefill_context: int = 0,
    ) -> float:
        """Seconds to decode one token for each of `decode_batch` sequences holding
        `decode_context` cached tokens in total, while prefilling `prefill_tokens` new tokens
        that attend to `prefill_context` cached tokens (chunked prefill)."""
        ...

    def prefill_time(self, new_tokens: int, cached_context: int = 0) -> float: ...

    def decode_step_time(self, batch: int, total_context: int) -> float: ...


class _IterationModel:
    """Argument checks and the two convenience wrappers shared by the latency models."""

    def iteration_time(
        self,
        decode_batch: int,
        decode_context: int,
        prefill_tokens: int = 0,
        prefill_context: int = 0,
    ) -> float:
        args = {
            "decode_batch": decode_batch,
            "decode_context": decode_context,
            "prefill_tokens": prefill_tokens,
            "prefill_context": prefill_context,
        }
        for name, value in args.items():
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if decode_batch == 0 and prefill_tokens == 0:
            return 0.0
        return self._busy_time(decode_batch, decode_context, prefill_tokens, prefill_context)

    def prefill_time(self, new_tokens: int, cached_context: int = 0) -> float:
        return self.iteration_time(0, 0, new_tokens, cached_context)

    def decode_step_time(self, batch: int, total_context: int) -> float:
        return self.iteration_time(batch, total_context)

    def _busy_time(self, db: int, dc: int, pt: int, pc: int) -> float:
        raise NotImplementedError


def _check_tp(tp: int, model: ModelSpec | None = None) -> None:
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    # NOTE: beyond the KV heads, engines replicate each head over tp / heads ranks (vLLM does)
    if model is not None and model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ConfigError(
            f"tp={tp} must divide {model.name}'s {model.num_kv_heads} KV heads or be a "
            "multiple of them"
        )


def _prefill_pairs(prefill_tokens: float, prefill_context: float) -> float:
    """(query, key) pairs of a causal prefill chunk over `prefill_context` cached tokens."""
    return prefill_tokens * prefill_context + prefill_tokens**2 / 2


class RooflineLatencyModel(_IterationModel):
    """max(compute, HBM traffic) per GPU, plus tensor-parallel all-reduces and a fixed overhead.

    Compute: 2·params FLOPs per new token plus attention FLOPs per (query, key) pair, at the
    calibrated MFU of prefill or decode. HBM: weights once per iteration, the cached KV that is
    attended, and the KV written for new tokens. All-reduce: 2 per layer of tokens×hidden bf16
    bytes, ring cost 2(tp−1)/tp over NVLink plus a fixed latency each.
    """

    def __init__(
        self,
        gpu: GpuSpec | GpuType | str,
        model: ModelSpec | str,
        tp: int = 1,
        calibration: Calibration | None = None,
    ) -> None:
        self.gpu = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
        self.model = model if isinstance(model, ModelSpec) else model_spec(model)
        _check_tp(tp, self.model)
        self.tp = tp
        self.num_gpus = tp
        self.calibration = calibration if calibration is not None else load_calibration()

    def __repr__(self) -> str:
        return f"RooflineLatencyModel({self.gpu.gpu}, {self.model.name}, tp={self.tp})"

    @property
    def kv_capacity_tokens(self) -> int:
        usable = self.tp * self.gpu.hbm_gb * 1e9 * self.calibration.memory_fraction
        return max(0, int((usable - self.model.weight_bytes) // self.model.kv_bytes_per_token))

    def _busy_time(self, db: int, dc: int, pt: int, pc: int) -> float:
        compute = self._compute_s(db, dc, pt, pc)
        memory = self._memory_s(db, dc, pt, pc)
        return (
            max(compute, memory)
            + self._allreduce_s(db + pt)
            + self.calibration.iteration_overhead_s
        )

    def _compute_s(self, db: int, dc: int, pt: int, pc: int) -> float:
        m, cal = self.model, self.calibration
        peak = self.gpu.bf16_tflops * 1e12 * self.tp
        decode = m.flops_per_token * db + m.attn_flops_per_pair * (dc + db)
        prefill = m.flops_per_token * pt + m.attn_flops_per_pair * _prefill_pairs(pt, pc)
        return decode / (peak * cal.decode_mfu) + prefill / (peak * cal.prefill_mfu)

    def _memory_s(self, db: int, dc: int, pt: int, pc: int) -> float:
        m = self.model
        # NOTE: prefill reads its cached context once (flash-attention tiles), not once per query.
        kv = m.kv_bytes_per_token * (dc + pc + db + pt) * max(1, self.tp // m.num_kv_heads)
        nbytes = _weights_read(m, db + pt) + kv
        return nbytes / (self.gpu.hbm_bw_tbs * 1e12 * self.tp * self.calibration.decode_mbu)

    def _allreduce_s(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        cal = self.calibration
        nbytes = tokens * self.model.hidden_size * 2
        ring = 2 * (self.tp - 1) / self.tp * nbytes
        one = ring / (self.gpu.nvlink_gbs * 1e9 * cal.allreduce_efficiency)
        return 2 * self.model.num_layers * (one + cal.allreduce_latency_s)


def _weights_read(m: ModelSpec, tokens: int) -> float:
    """Weight bytes one iteration reads: all of a dense model's; of a mixture of experts, the
    shared part and the experts its `tokens` route to (each picks k of E per layer, uniformly:
    a layer's expert is read with probability 1 − (1 − k/E)^tokens)."""
    if not m.is_moe:
        return m.weight_bytes
    expert = min(
        m.weight_bytes,
        2.0 * m.num_layers * m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size,
    )
    touched = 1.0 - (1.0 - m.experts_per_token / m.num_experts) ** max(tokens, 1)
    return m.weight_bytes - expert + expert * touched


class ProfileRow(NamedTuple):
    """One measured iteration: its four arguments and the seconds it took."""

    decode_batch: int
    decode_context: int
    prefill_tokens: int
    prefill_context: int
    seconds: float


def _features(db: float, dc: float, pt: float, pc: float) -> np.ndarray:
    return np.array([1.0, db, dc, pt, pt * pc + pt**2 / 2])


@dataclass(frozen=True, kw_only=True)
class ProfiledLatencyModel(_IterationModel):
    """Non-negative linear model over [1, decode_batch, decode_context, prefill_tokens,
    prefill_tokens·prefill_context + prefill_tokens²/2], fitted to measured iterations.

    Non-negative coefficients over non-negative features make it monotone in every argument.
    NOTE: being linear, it cannot bend at the compute/memory ridge: fitted to rows on both sides
    (memory-bound decode steps and compute-bound prefills) it errs by up to ~45% near the ridge.
    Fit one profile per regime, or keep the rows to the regime the worker runs in.
    """

    coefficients: tuple[float, float, float, float, float]
    kv_capacity_tokens: int
    tp: int = 1

    def __post_init__(self) -> None:
        _check_tp(self.tp)
        if len(self.coefficients) != 5 or min(self.coefficients) < 0:
            raise ConfigError(f"need 5 coefficients >= 0, got {self.coefficients}")
        if self.kv_capacity_tokens < 0:
            raise ConfigError(f"kv_capacity_tokens must be >= 0, got {self.kv_capacity_tokens}")

    @property
    def num_gpus(self) -> int:
        return self.tp

    def _busy_time(self, db: int, dc: int, pt: int, pc: int) -> float:
        return float(np.dot(self.coefficients, _features(db, dc, pt, pc)))

    @classmethod
    def fit(
        cls,
        rows: Iterable[ProfileRow | tuple[int, int, int, int, float]],
        kv_capacity_tokens: int,
        tp: int = 1,
    ) -> ProfiledLatencyModel:
        """Least relative squared error (rows weighted by 1/seconds) with `scipy.optimize.nnls`."""
        data = np.array([tuple(r) for r in rows], dtype=float).reshape(-1, 5)
        if len(data) < 5:
            raise ConfigError(f"need at least 5 profile rows to fit, got {len(data)}")
        if (data < 0).any() or (data[:, 4] <= 0).any():
            raise ConfigError("profile rows need arguments >= 0 and seconds > 0")
        a = np.stack([_features(*row[:4]) for row in data]) / data[:, 4:5]
        coef, _ = nnls(a, np.ones(len(data)))
        return cls(
            coefficients=tuple(float(c) for c in coef),  # type: ignore[arg-type]
            kv_capacity_tokens=kv_capacity_tokens,
            tp=tp,
        )

    @classmethod
    def load(
        cls, path: str | Path, *, tp: int | None = None, kv_capacity_tokens: int | None = None
    ) -> ProfiledLatencyModel:
        """Fit a profile CSV: header `decode_batch,decode_context,prefill_tokens,prefill_context,
        seconds`, preceded by `# key: value` comment lines; `# tp:` and `# kv_capacity_tokens:`
        supply the worker's shape unless given as arguments."""
        meta: dict[str, str] = {}
        body: list[str] = []
        for line in Path(path).read_text().splitlines():
            if line.startswith("#"):
                key, sep, value = line[1:].partition(":")
                if sep and key.strip().isidentifier():
                    meta[key.strip()] = value.strip()
            elif line.strip():
                body.append(line)
        tp = tp if tp is not None else int(meta.get("tp", 1))
        if kv_capacity_tokens is None:
            if "kv_capacity_tokens" not in meta:
                raise ConfigError(f"{path}: no '# kv_capacity_tokens:' header and none given")
            kv_capacity_tokens = int(meta["kv_capacity_tokens"])
        reader = csv.DictReader(body)
        missing = set(ProfileRow._fields) - set(reader.fieldnames or ())
        if missing:
            raise ConfigError(f"{path}: missing columns {sorted(missing)}")
        rows = [
            ProfileRow(
                decode_batch=int(rec["decode_batch"]),
                decode_context=int(rec["decode_context"]),
                prefill_tokens=int(rec["prefill_tokens"]),
                prefill_context=int(rec["prefill_context"]),
                seconds=float(rec["seconds"]),
            )
            for rec in reader
        ]
        return cls.fit(rows, kv_capacity_tokens=kv_capacity_tokens, tp=tp)


def sample_profile(lat: LatencyModel) -> list[ProfileRow]:
    """A profiling grid (decode-only, prefill-only and mixed iterations) timed on `lat`."""
    cap = lat.kv_capacity_tokens
    shapes: list[tuple[int, int, int, int]] = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for ctx in (256, 1024, 4096, 16384):
            if batch * ctx <= cap:
                shapes.append((batch, batch * ctx, 0, 0))
    for chunk in (128, 512, 2048, 8192):
        for cached in (0, 2048, 8192, 32768):
            if chunk + cached <= cap:
                shapes.append((0, 0, chunk, cached))
                shapes.append((16, 16 * 1024, chunk, cached))
    return [ProfileRow(*s, lat.iteration_time(*s)) for s in shapes]


def save_profile(
    path: str | Path,
    rows: Iterable[ProfileRow],
    *,
    tp: int,
    kv_capacity_tokens: int,
    note: str = "",
) -> None:
    """Write rows in the format `ProfiledLatencyModel.load` reads."""
    lines = [f"# {line}" for line in note.splitlines()]
    lines += [f"# tp: {tp}", f"# kv_capacity_tokens: {kv_capacity_tokens}"]
    lines.append(",".join(ProfileRow._fields))
    lines += [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in rows]
    Path(path).write_text("\n".join(lines) + "\n")
