"""Online serving traffic that ROSE (seed 002) lends serving GPUs around: a stream of requests
(arrival time, prompt tokens, output tokens), read from the Azure LLM inference trace format or
generated as a bursty synthetic day calibrated to the paper's Fig. 3a.

Where each number comes from: "ROSE" is the paper (seed 002, section and figure given); the
vendored traces are the Azure LLM inference trace 2023 (CC BY 4.0, Patel et al., Splitwise,
ISCA 2024; see `data/README.md`); "assumed" marks a choice with its reason. ROSE measures its
Fig. 3a on a 24-hour Microsoft trace (DynamoLLM's week-long 2024 trace, its ref. [59]) that is
not vendored here; the synthetic day reproduces the statistics the paper reports about it.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import IO

import numpy as np
from scipy.signal import lfilter

from loom.core.errors import ConfigError
from loom.core.rng import stream
from loom.perf.specs import gpu_spec, load_calibration, model_spec

__all__ = [
    "DEFAULT_MEAN_RPS",
    "PAPER_DENSITIES",
    "PAPER_MINUTE_PEAK_RATIO",
    "PAPER_REPLAY_GPU",
    "PAPER_REPLAY_GPUS",
    "PAPER_REPLAY_MODEL",
    "PAPER_SECOND_PEAK_RATIOS",
    "PAPER_SM_UTILISATION",
    "Azure2023",
    "DayShape",
    "ServingTrace",
    "TraceSummary",
    "WindowRule",
    "azure_2023",
    "find_window",
    "intensity",
    "mean_rate",
    "minute_peak_ratio",
    "named_window",
    "plot_fig3a",
    "prefill_share",
    "read_azure_trace",
    "rps_at_utilisation",
    "second_peak_ratios",
    "summarize",
    "synthetic_day",
    "token_quantiles",
    "window",
]

# ---- the paper's measurements (ROSE §3.2, Fig. 3a/3b; Appendix D) --------------------------
PAPER_MINUTE_PEAK_RATIO = 1.7  # Fig. 3a: per-minute peak rate / 24-hour mean
PAPER_SECOND_PEAK_RATIOS = (4.22, 1.58, 1.73)  # Fig. 3a: per-second peak / 5-minute mean
PAPER_SM_UTILISATION = 0.189  # Fig. 3b: mean SM utilisation replaying the day
# §3.2: Fig. 3b replays the day on Qwen3-8B served by 8 H800 GPUs
PAPER_REPLAY_MODEL = "qwen3-8b"
PAPER_REPLAY_GPU = "h800"
PAPER_REPLAY_GPUS = 8
PAPER_DENSITIES = (1.0, 1.5, 2.0)  # Table 5: serving-arrival density multipliers

# Mean request rate of the synthetic day. NOTE: `rps_at_utilisation` turns Fig. 3b's 18.9% SM
# utilisation of 8 H800s serving Qwen3-8B into 39.9 requests/s (26.5 before issue 28 measured
# prefill kernels 1.6x faster than the former MFU estimate) (requests sized as the vendored
# 2023 conversation trace; time on the SMs = FLOPs / (peak × calibration.toml's achieved prefill
# and decode MFU)). Two checks agree: Fig. 3a's calm windows (per-second peaks 1.58× and 1.73×
# their 5-minute mean) need >= ~20 requests/s, since Poisson counting noise alone puts the peak
# of 300 seconds at 1 + ~3/sqrt(rate) times the mean; and at peak FLOPs alone (MFU 1) the same
# utilisation would be 64 requests/s, an upper bound.
DEFAULT_MEAN_RPS = 39.9

SECONDS_PER_MINUTE = 60
DAY_S = 86_400.0
MAX_HOURS = 7 * 24.0  # a week of seconds: the generator holds per-second arrays in memory

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


# ---- the trace ------------------------------------------------------------------------------
def _frozen(a: np.ndarray, dtype: type) -> np.ndarray:
    out: np.ndarray = np.array(a, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class ServingTrace:
    """Serving requests in arrival order; arrays are read-only and share one index."""

    name: str
    source: str  # where the requests come from (a file, a dataset, a generator and its seed)
    arrival_s: np.ndarray  # float64, seconds from the trace's start, non-decreasing
    prompt_tokens: np.ndarray  # int64, >= 0
    output_tokens: np.ndarray  # int64, >= 0
    duration_s: float  # the span covered: every arrival lies in [0, duration_s]

    def __post_init__(self) -> None:
        arrival = _frozen(self.arrival_s, np.float64)
        prompt = _frozen(self.prompt_tokens, np.int64)
        output = _frozen(self.output_tokens, np.int64)
        if not (arrival.ndim == prompt.ndim == output.ndim == 1):
            raise ConfigError(f"trace {self.name!r}: arrays must be one-dimensional")
        if not len(arrival) == len(prompt) == len(output):
            raise ConfigError(
                f"trace {self.name!r}: {len(arrival)} arrivals, {len(prompt)} prompt sizes and "
                f"{len(output)} output sizes; they must match"
            )
        if not math.isfinite(self.duration_s) or self.duration_s < 0:
            raise ConfigError(
                f"trace {self.name!r}: duration must be >= 0 s, got {self.duration_s}"
            )
        if len(arrival):
            if not np.all(np.isfinite(arrival)):
                raise ConfigError(f"trace {self.name!r}: arrival times must be finite")
            if np.any(np.diff(arrival) < 0):
                raise ConfigError(f"trace {self.name!r}: arrival times must be non-decreasing")
            if arrival[0] < 0 or arrival[-1] > self.duration_s:
                raise ConfigError(
                    f"trace {self.name!r}: arrivals span [{arrival[0]}, {arrival[-1]}] s, "
                    f"outside [0, {self.duration_s}] s"
                )
            if prompt.min() < 0 or output.min() < 0:
                raise ConfigError(f"trace {self.name!r}: token counts must be >= 0")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_tokens", prompt)
        object.__setattr__(self, "output_tokens", output)
        object.__setattr__(self, "duration_s", float(self.duration_s))

    def __len__(self) -> int:
        return len(self.arrival_s)


# ---- the Azure LLM inference trace format ---------------------------------------------------
def _open_text(path: Path) -> IO[str]:
    with path.open("rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    if gzipped:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def _header_index(header: list[str], where: str) -> tuple[int, int, int]:
    names = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in AZURE_COLUMNS if c not in names]
    if missing:
        raise ConfigError(
            f"{where}:1: missing column(s) {', '.join(missing)}; an Azure LLM inference trace "
            f"has the header {','.join(AZURE_COLUMNS)} (got {','.join(names) or 'nothing'})"
        )
    t, p, o = (names.index(c) for c in AZURE_COLUMNS)
    return t, p, o


def _tokens(text: str, column: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where}: {column} {text!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{where}: {column} must be >= 0, got {value}")
    return value


def _timestamp(text: str, where: str) -> datetime:
    # NOTE: Python >= 3.11 parses any number of fractional digits (the 2023 trace has 7, the
    # 2024 trace 6 and a UTC offset); digits beyond microseconds are dropped.
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{where}: unparsable TIMESTAMP {text!r} (expected e.g. 2023-11-16 18:15:46.6805900)"
        ) from None


def _parse_azure(rows: Iterable[list[str]], where: str, name: str, source: str) -> ServingTrace:
    it = iter(rows)
    header = next(it, None)
    if header is None:
        raise ConfigError(f"{where}: empty file; expected the header {','.join(AZURE_COLUMNS)}")
    ti, pi, oi = _header_index(header, where)
    width = len(header)
    start: datetime | None = None
    last = -math.inf
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    for lineno, row in enumerate(it, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        at = f"{where}:{lineno}"
        if len(row) != width:
            raise ConfigError(f"{at}: {len(row)} fields, the header has {width}")
        stamp = _timestamp(row[ti], at)
        if start is None:
            start = stamp
        try:
            t = (stamp - start).total_seconds()
        except TypeError:
            raise ConfigError(
                f"{at}: TIMESTAMP {row[ti]!r} mixes time-zone-aware and naive"
            ) from None
        if t < last:
            raise ConfigError(f"{at}: TIMESTAMP {row[ti]!r} is earlier than the line before")
        last = t
        times.append(t)
        prompts.append(_tokens(row[pi], "ContextTokens", at))
        outputs.append(_tokens(row[oi], "GeneratedTokens", at))
    if not times:
        raise ConfigError(f"{where}: no requests after the header")
    return ServingTrace(
        name=name,
        source=source,
        arrival_s=np.asarray(times),
        prompt_tokens=np.asarray(prompts),
        output_tokens=np.asarray(outputs),
        duration_s=times[-1],
    )


def read_azure_trace(
    path: str | Path, *, name: str | None = None, source: str | None = None
) -> ServingTrace:
    """Read a CSV (or gzipped CSV) in the Azure LLM inference trace format: a header
    `TIMESTAMP,ContextTokens,GeneratedTokens` (any column order, extra columns ignored), one
    request per line. Arrivals are seconds after the first request; the trace spans up to the
    last. Malformed input raises `ConfigError` naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no trace file at {p}")
    label = name if name is not None else p.name.removesuffix(".gz").removesuffix(".csv")
    with _open_text(p) as f:
        try:
            return _parse_azure(csv.reader(f), str(p), label, source or str(p))
        except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
            raise ConfigError(f"{p}: not a readable CSV trace ({e})") from None


# ---- the vendored 2023 traces ---------------------------------------------------------------
class Azure2023(StrEnum):
    """The two services of the Azure LLM inference trace 2023 (one hour each)."""

    CONV = "conv"
    CODE = "code"


_AZURE_2023_SOURCE = (
    "Azure LLM inference trace 2023 ({kind}), github.com/Azure/AzurePublicDataset, CC BY 4.0; "
    "Patel et al., Splitwise, ISCA 2024"
)


@cache
def azure_2023(kind: Azure2023 | str = Azure2023.CONV) -> ServingTrace:
    """The vendored Azure LLM inference trace 2023: `conv` (19,366 requests in 58 min) or
    `code` (8,819 requests in 57 min)."""
    try:
        k = Azure2023(str(kind).lower())
    except ValueError:
        known = ", ".join(a.value for a in Azure2023)
        raise ConfigError(f"unknown Azure 2023 trace {kind!r}; known: {known}") from None
    filename = f"AzureLLMInferenceTrace_{k.value}.csv.gz"
    ref = resources.files("loom.sim.workloads").joinpath("data").joinpath(filename)
    with ref.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8", newline="") as f:
        return _parse_azure(
            csv.reader(f), filename, f"azure2023-{k.value}", _AZURE_2023_SOURCE.format(kind=k)
        )


# ---- the synthetic day ----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DayShape:
    """The rate's shape: a diurnal curve × a minute-level lognormal AR(1) × per-second gamma
    noise × rare one-second spikes. Defaults meet ROSE's Fig. 3a at `DEFAULT_MEAN_RPS`."""

    diurnal_amplitude: float = field(
        default=0.45,
        metadata={
            "help": "assumed: one daily cosine, peak/trough 2.6 (LLM services follow working "
            "hours). With little minute-level noise the minute peak stays near 1.7 for every "
            "seed; the paper gives only the peak, not the curve"
        },
    )
    peak_hour: float = field(
        default=14.0, metadata={"help": "assumed: afternoon peak, trough 12 hours later"}
    )
    minute_sigma: float = field(
        default=0.06,
        metadata={
            "help": "calibrated: log-sd of the minute-level multiplier so that the per-minute "
            "peak is 1.7× the day's mean (Fig. 3a) together with the diurnal curve"
        },
    )
    minute_corr_min: float = field(
        default=10.0,
        metadata={"help": "assumed: minute-level swings persist ~10 minutes (AR(1) time constant)"},
    )
    second_shape: float = field(
        default=100.0,
        metadata={
            "help": "calibrated: gamma shape k of the per-second rate multiplier (CV 1/sqrt(k) "
            "= 0.1), with Poisson counts on top; at the default rate the median 5-minute window "
            "then peaks at ~1.75× its mean and the calmest at ~1.45×, around Fig. 3a's 1.58× "
            "and 1.73×"
        },
    )
    spikes_per_hour: float = field(
        default=2.0,
        metadata={
            "help": "calibrated: one-second surges (BurstGPT's second-level spikes, cited by "
            "§3.2) so that a few percent of 5-minute windows peak above 3× their mean and the "
            "day's largest reach Fig. 3a's 4.22×"
        },
    )
    spike_median: float = field(
        default=1.6,
        metadata={"help": "calibrated: median extra rate of a spike second, × the local rate"},
    )
    spike_sigma: float = field(
        default=0.35, metadata={"help": "calibrated: lognormal sigma of a spike's extra rate"}
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.diurnal_amplitude < 1.0:
            raise ConfigError(
                f"diurnal_amplitude must be in [0, 1) (the rate stays positive), got "
                f"{self.diurnal_amplitude}"
            )
        positive = ("minute_corr_min", "second_shape")
        nonneg = ("minute_sigma", "spikes_per_hour", "spike_median", "spike_sigma")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in nonneg:
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")


def _check_span(hours: float) -> float:
    if not (isinstance(hours, int | float) and 0 < hours <= MAX_HOURS):
        raise ConfigError(f"hours must be in (0, {MAX_HOURS:g}], got {hours!r}")
    return float(hours) * 3600.0


def _widths(duration_s: float) -> np.ndarray:
    """Length of each one-second bin of [0, duration_s) (the last may be partial)."""
    n = math.ceil(duration_s)
    w = np.ones(n)
    w[-1] = duration_s - (n - 1)
    return w


def _minute_factor(shape: DayShape, minutes: int, seed: int) -> np.ndarray:
    """exp of a stationary Gaussian AR(1) with log-sd `minute_sigma`, mean 1."""
    rng = stream(seed, "serving/minute")
    rho = math.exp(-1.0 / shape.minute_corr_min)
    z0 = rng.standard_normal()
    e = rng.standard_normal(minutes) * math.sqrt(1.0 - rho**2)
    z = lfilter([1.0], [1.0, -rho], e, zi=[rho * z0])[0]
    s = shape.minute_sigma
    return np.exp(s * z - s * s / 2.0)


def _spike_factor(shape: DayShape, seconds: int, hours: float, seed: int) -> np.ndarray:
    rng = stream(seed, "serving/spikes")
    count = rng.poisson(shape.spikes_per_hour * hours)
    at = rng.integers(0, seconds, count)
    extra = shape.spike_median * np.exp(shape.spike_sigma * rng.standard_normal(count))
    factor = np.ones(seconds)
    np.add.at(factor, at, extra)
    return factor


def intensity(hours: float = 24.0, *, seed: int = 0, shape: DayShape | None = None) -> np.ndarray:
    """Expected requests in each second of the synthetic day, normalised to a mean of 1 per
    full second over the span (a partial last second counts its width). Seconds start at
    midnight; the curve does not depend on the request rate or density."""
    shape = shape or DayShape()
    duration = _check_span(hours)
    widths = _widths(duration)
    n = len(widths)
    mid_h = (np.arange(n) + widths / 2.0) / 3600.0
    diurnal = 1.0 + shape.diurnal_amplitude * np.cos(2.0 * np.pi * (mid_h - shape.peak_hour) / 24.0)
    minute = _minute_factor(shape, math.ceil(n / SECONDS_PER_MINUTE), seed)
    minute = np.repeat(minute, SECONDS_PER_MINUTE)[:n]
    k = shape.second_shape
    second = stream(seed, "serving/second").gamma(k, 1.0 / k, n)
    rate = diurnal * minute * second * _spike_factor(shape, n, float(hours), seed) * widths
    return rate * (duration / rate.sum())


def _arrivals(
    counts: np.ndarray, widths: np.ndarray, duration: float, rng: np.random.Generator
) -> np.ndarray:
    start = np.repeat(np.arange(len(counts), dtype=np.float64), counts)
    t = start + rng.random(len(start)) * np.repeat(widths, counts)
    return np.sort(np.minimum(t, np.nextafter(duration, 0.0)))


def _layer(
    rate: np.ndarray, widths: np.ndarray, duration: float, sizes: ServingTrace, seed: int, tag: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    counts = stream(seed, f"serving/{tag}/counts").poisson(rate)
    t = _arrivals(counts, widths, duration, stream(seed, f"serving/{tag}/times"))
    pick = stream(seed, f"serving/{tag}/sizes").integers(0, len(sizes), len(t))
    return t, sizes.prompt_tokens[pick], sizes.output_tokens[pick]


def synthetic_day(
    *,
    mean_rps: float = DEFAULT_MEAN_RPS,
    hours: float = 24.0,
    density: float = 1.0,
    seed: int = 0,
    shape: DayShape | None = None,
    sizes: ServingTrace | None = None,
) -> ServingTrace:
    """A bursty day of serving requests shaped like ROSE's Fig. 3a.

    The model is a doubly stochastic Poisson process with a piecewise-constant rate per second:
    `mean_rps × density × intensity(hours, seed)`, i.e. a diurnal cosine × a minute-level
    lognormal AR(1) × a gamma(k, 1/k) per-second multiplier × rare one-second spikes, rescaled
    so that the span's mean is exactly `mean_rps` (× `density`). Arrivals are uniform within
    their second. NOTE: a gamma-modulated Poisson process rather than resampling the vendored
    2023 trace's burst shape: that trace runs at 5.5 requests/s, where Poisson counting noise
    alone sets its per-second peaks (2.0-3.2× their 5-minute means), so its shape does not
    carry over to the paper's rate, whose calm windows peak at only 1.58× and 1.73×; the
    explicit model keeps the burst shape and the rate separable and every parameter named.
    The per-second ratios still depend on the rate through counting noise: `DayShape`'s
    defaults are calibrated at `DEFAULT_MEAN_RPS`, and at density 2 the median window's peak
    falls from ~1.75× to ~1.57× its mean (the minute-level shape is unchanged).

    Request sizes (prompt and output tokens, drawn jointly) are resampled from `sizes`,
    by default the vendored 2023 conversation trace. `density` (Table 5) scales the rate and
    keeps the shape: the rate curve depends only on `seed`, the density-1 requests come from
    one set of streams, a density above 1 adds requests at rate `(density - 1) × rate` from
    another, and a density below 1 keeps each density-1 request with probability `density`.
    So a denser day holds every request of the density-1 day, and the same seed gives the
    same arrays.
    """
    if not (isinstance(mean_rps, int | float) and math.isfinite(mean_rps) and mean_rps > 0):
        raise ConfigError(f"mean_rps must be > 0 requests/s, got {mean_rps!r}")
    if not (isinstance(density, int | float) and math.isfinite(density) and density > 0):
        raise ConfigError(f"density must be > 0 (Table 5 uses 1, 1.5 and 2), got {density!r}")
    duration = _check_span(hours)
    sizes = sizes if sizes is not None else azure_2023(Azure2023.CONV)
    if len(sizes) == 0:
        raise ConfigError(f"trace {sizes.name!r} has no requests to draw sizes from")
    widths = _widths(duration)
    rate = float(mean_rps) * intensity(hours, seed=seed, shape=shape)
    t, p, o = _layer(rate, widths, duration, sizes, seed, "base")
    if density < 1.0:
        keep = stream(seed, "serving/thin").random(len(t)) < density
        t, p, o = t[keep], p[keep], o[keep]
    elif density > 1.0:
        te, pe, oe = _layer((density - 1.0) * rate, widths, duration, sizes, seed, "extra")
        order = np.argsort(np.concatenate([t, te]), kind="stable")
        t = np.concatenate([t, te])[order]
        p = np.concatenate([p, pe])[order]
        o = np.concatenate([o, oe])[order]
    return ServingTrace(
        name=f"synthetic-day-{mean_rps:g}rps-x{density:g}",
        source=(
            f"loom synthetic_day(mean_rps={mean_rps:g}, hours={hours:g}, density={density:g}, "
            f"seed={seed}): ROSE Fig. 3a burstiness; sizes from {sizes.name}"
        ),
        arrival_s=t,
        prompt_tokens=p,
        output_tokens=o,
        duration_s=duration,
    )


# ---- slices ---------------------------------------------------------------------------------
def window(trace: ServingTrace, start_s: float, duration_s: float) -> ServingTrace:
    """The requests arriving in [start_s, start_s + duration_s), re-based to start at 0."""
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ConfigError(f"window start must be >= 0 s, got {start_s}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"window duration must be > 0 s, got {duration_s}")
    if start_s + duration_s > trace.duration_s:
        raise ConfigError(
            f"window [{start_s:g}, {start_s + duration_s:g}) s runs past trace "
            f"{trace.name!r}, which spans {trace.duration_s:g} s"
        )
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, start_s + duration_s], side="left")
    return ServingTrace(
        name=f"{trace.name}[{start_s:g}s+{duration_s:g}s]",
        source=f"{trace.source}; window [{start_s:g}, {start_s + duration_s:g}) s",
        arrival_s=trace.arrival_s[lo:hi] - start_s,
        prompt_tokens=trace.prompt_tokens[lo:hi],
        output_tokens=trace.output_tokens[lo:hi],
        duration_s=duration_s,
    )


class WindowRule(StrEnum):
    """How an experiment names the slice of the day it replays."""

    BUSIEST = "busiest"  # the most requests
    QUIETEST = "quietest"  # the fewest requests
    MEAN = "mean"  # the rate closest to the whole trace's mean rate (the earliest on ties)


def _pick_busiest(counts: np.ndarray, target: float) -> int:
    return int(np.argmax(counts))


def _pick_quietest(counts: np.ndarray, target: float) -> int:
    return int(np.argmin(counts))


def _pick_mean(counts: np.ndarray, target: float) -> int:
    return int(np.argmin(np.abs(counts - target)))


_WINDOW_RULES: dict[WindowRule, Callable[[np.ndarray, float], int]] = {
    WindowRule.BUSIEST: _pick_busiest,
    WindowRule.QUIETEST: _pick_quietest,
    WindowRule.MEAN: _pick_mean,
}


def find_window(
    trace: ServingTrace,
    rule: WindowRule | str,
    duration_s: float = 3600.0,
    step_s: float = 60.0,
) -> float:
    """Start (s) of the `duration_s` slice chosen by `rule`, among starts on a `step_s` grid."""
    try:
        pick = _WINDOW_RULES[WindowRule(rule)]
    except ValueError:
        known = ", ".join(r.value for r in WindowRule)
        raise ConfigError(f"unknown window rule {rule!r}; known: {known}") from None
    if not (math.isfinite(step_s) and step_s > 0):
        raise ConfigError(f"window step must be > 0 s, got {step_s}")
    if not (math.isfinite(duration_s) and 0 < duration_s <= trace.duration_s):
        raise ConfigError(
            f"window duration must be in (0, {trace.duration_s:g}] s for trace "
            f"{trace.name!r}, got {duration_s}"
        )
    starts = np.arange(0.0, trace.duration_s - duration_s + 1e-9, step_s)
    ends = np.searchsorted(trace.arrival_s, starts + duration_s, side="left")
    counts = ends - np.searchsorted(trace.arrival_s, starts, side="left")
    target = len(trace) * duration_s / trace.duration_s
    return float(starts[pick(counts.astype(np.float64), target)])


def named_window(
    trace: ServingTrace, rule: WindowRule | str, duration_s: float = 3600.0
) -> ServingTrace:
    """`window` at `find_window(trace, rule, duration_s)`: e.g. the busiest hour of the day."""
    return window(trace, find_window(trace, rule, duration_s), duration_s)


# ---- statistics -----------------------------------------------------------------------------
def _binned(trace: ServingTrace, bin_s: float) -> np.ndarray:
    """Requests per full `bin_s` bin of the trace's span (a partial last bin is dropped)."""
    bins = int(trace.duration_s // bin_s)
    if bins < 1:
        raise ConfigError(
            f"trace {trace.name!r} spans {trace.duration_s:g} s, less than one {bin_s:g}-s bin"
        )
    idx = (trace.arrival_s // bin_s).astype(np.int64)
    return np.bincount(idx[idx < bins], minlength=bins)


def mean_rate(trace: ServingTrace) -> float:
    """Requests per second over the trace's span."""
    if trace.duration_s <= 0:
        raise ConfigError(f"trace {trace.name!r} spans no time")
    return len(trace) / trace.duration_s


def minute_peak_ratio(trace: ServingTrace) -> float:
    """Busiest minute's requests / the mean per minute (Fig. 3a's 1.7), over full minutes."""
    counts = _binned(trace, SECONDS_PER_MINUTE)
    if counts.sum() == 0:
        raise ConfigError(f"trace {trace.name!r} has no requests in its full minutes")
    return float(counts.max() / counts.mean())


def second_peak_ratios(trace: ServingTrace, window_s: float = 300.0) -> np.ndarray:
    """Per consecutive full `window_s` window: its busiest second's requests / its mean per
    second (Fig. 3a's 4.22, 1.58, 1.73 for three 5-minute windows). NaN for empty windows."""
    if not (math.isfinite(window_s) and window_s >= 1 and float(window_s).is_integer()):
        raise ConfigError(f"window_s must be a whole number of seconds >= 1, got {window_s}")
    w = int(window_s)
    per_second = _binned(trace, 1.0)
    windows = len(per_second) // w
    if windows < 1:
        raise ConfigError(f"trace {trace.name!r} spans less than one {w}-s window")
    blocks = per_second[: windows * w].reshape(windows, w).astype(np.float64)
    mean = blocks.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, blocks.max(axis=1) / mean, np.nan)


def token_quantiles(
    trace: ServingTrace, q: Sequence[float] = (0.5, 0.9, 0.99)
) -> dict[str, np.ndarray]:
    """Quantiles `q` of prompt and output tokens: `{"prompt": ..., "output": ...}`."""
    if len(trace) == 0:
        raise ConfigError(f"trace {trace.name!r} has no requests")
    qs = np.asarray(q, dtype=np.float64)
    if np.any((qs < 0) | (qs > 1)):
        raise ConfigError(f"quantiles must be in [0, 1], got {list(q)}")
    return {
        "prompt": np.quantile(trace.prompt_tokens, qs),
        "output": np.quantile(trace.output_tokens, qs),
    }


def prefill_share(trace: ServingTrace) -> float:
    """Prompt tokens / all tokens (prompt + output)."""
    total = int(trace.prompt_tokens.sum() + trace.output_tokens.sum())
    if total == 0:
        raise ConfigError(f"trace {trace.name!r} has no tokens")
    return float(trace.prompt_tokens.sum() / total)


@dataclass(frozen=True, kw_only=True)
class TraceSummary:
    """The statistics a test or a report prints about one trace."""

    name: str
    requests: int
    duration_s: float
    mean_rps: float
    minute_peak_ratio: float
    second_peak_median: float  # over 5-minute windows
    second_peak_min: float
    second_peak_max: float
    prompt_p50: float
    prompt_p99: float
    output_p50: float
    output_p99: float
    prefill_share: float


def summarize(trace: ServingTrace, window_s: float = 300.0) -> TraceSummary:
    """Fig. 3a's burstiness and the request sizes of `trace` (needs one full `window_s`)."""
    ratios = second_peak_ratios(trace, window_s)
    q = token_quantiles(trace, (0.5, 0.99))
    return TraceSummary(
        name=trace.name,
        requests=len(trace),
        duration_s=trace.duration_s,
        mean_rps=mean_rate(trace),
        minute_peak_ratio=minute_peak_ratio(trace),
        second_peak_median=float(np.nanmedian(ratios)),
        second_peak_min=float(np.nanmin(ratios)),
        second_peak_max=float(np.nanmax(ratios)),
        prompt_p50=float(q["prompt"][0]),
        prompt_p99=float(q["prompt"][1]),
        output_p50=float(q["output"][0]),
        output_p99=float(q["output"][1]),
        prefill_share=prefill_share(trace),
    )


# ---- load from utilisation ------------------------------------------------------------------
def rps_at_utilisation(
    utilisation: float = PAPER_SM_UTILISATION,
    *,
    gpus: int = PAPER_REPLAY_GPUS,
    model: str = PAPER_REPLAY_MODEL,
    gpu: str = PAPER_REPLAY_GPU,
    sizes: ServingTrace | None = None,
) -> float:
    """Requests/s that keep `gpus` GPUs' SMs busy a fraction `utilisation` of the time, on a
    roofline: a request's SM time is its prefill FLOPs / (peak × prefill MFU) plus its decode
    FLOPs / (peak × decode MFU) (linear layers and attention; calibration.toml's achieved
    fractions), averaged over the requests of `sizes` (default: the 2023 conversation trace).
    Decode's memory stalls are not counted as SM work: a rough argument, not a queueing model."""
    if not 0 < utilisation <= 1:
        raise ConfigError(f"utilisation must be in (0, 1], got {utilisation}")
    if gpus < 1:
        raise ConfigError(f"gpus must be >= 1, got {gpus}")
    sizes = sizes if sizes is not None else azure_2023(Azure2023.CONV)
    if len(sizes) == 0:
        raise ConfigError(f"trace {sizes.name!r} has no requests")
    m, g, cal = model_spec(model), gpu_spec(gpu), load_calibration()
    p = sizes.prompt_tokens.astype(np.float64)
    o = sizes.output_tokens.astype(np.float64)
    prefill = m.flops_per_token * p + m.attn_flops_per_pair * p * (p + 1) / 2
    decode = m.flops_per_token * o + m.attn_flops_per_pair * (o * p + o * (o + 1) / 2)
    peak = g.bf16_tflops * 1e12
    sm_s = float(np.mean(prefill / (peak * cal.prefill_mfu) + decode / (peak * cal.decode_mfu)))
    return utilisation * gpus / sm_s


# ---- Fig. 3a --------------------------------------------------------------------------------
def _default_windows(trace: ServingTrace, window_s: float) -> list[float]:
    """Starts of the burstiest, the calmest and the median window, in time order."""
    ratios = second_peak_ratios(trace, window_s)
    valid = np.flatnonzero(np.isfinite(ratios))
    order = valid[np.argsort(ratios[valid], kind="stable")]
    picks = {int(order[-1]), int(order[0]), int(order[len(order) // 2])}
    return [k * window_s for k in sorted(picks)]


def plot_fig3a(
    trace: ServingTrace,
    path: str | Path,
    *,
    window_s: float = 300.0,
    windows: Sequence[float] | None = None,
    title: str | None = None,
) -> Path:
    """Fig. 3a's shape as a PNG: the per-minute rate over the trace normalised to its mean
    (top), and per-second rates of three `window_s` windows normalised to each window's mean
    (bottom; by default the burstiest, the median and the calmest window)."""
    import matplotlib

    matplotlib.use("Agg")  # NOTE: headless; never opens a window
    import matplotlib.pyplot as plt

    starts = list(windows) if windows is not None else _default_windows(trace, window_s)
    if not 1 <= len(starts) <= 6:
        raise ConfigError(f"plot between 1 and 6 windows, got {len(starts)}")
    minute = _binned(trace, SECONDS_PER_MINUTE)
    fig = plt.figure(figsize=(10, 5.6))
    grid = fig.add_gridspec(2, len(starts))
    top = fig.add_subplot(grid[0, :])
    top.plot(np.arange(len(minute)) / 60.0, minute / minute.mean(), lw=0.6, color="tab:blue")
    top.axhline(1.0, color="grey", lw=0.8, ls="--")
    top.set_xlabel("hour")
    top.set_xlim(0.0, trace.duration_s / 3600.0)
    top.set_ylabel("rate / mean (per minute)")
    top.set_title(f"per-minute peak {minute.max() / minute.mean():.2f}× the mean", fontsize=9)
    for i, s in enumerate(starts):
        part = window(trace, s, window_s)
        per_s = _binned(part, 1.0).astype(np.float64)
        norm = per_s / per_s.mean() if per_s.sum() else per_s
        ax = fig.add_subplot(grid[1, i])
        ax.plot(np.arange(len(per_s)), norm, lw=0.6, color="tab:orange")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{s / 3600:.2f} h: peak {norm.max():.2f}×", fontsize=9)
        ax.set_xlabel("second")
        if i == 0:
            ax.set_ylabel("rate / window mean")
        top.axvspan(s / 3600, (s + window_s) / 3600, color="tab:orange", alpha=0.3)
    fig.suptitle(title or f"{trace.name}: serving request rate")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
