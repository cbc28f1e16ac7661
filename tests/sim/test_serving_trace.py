"""Serving traffic for ROSE: the Azure trace reader, the vendored 2023 traces, the synthetic day
calibrated to ROSE's Fig. 3a, slices and statistics."""

from __future__ import annotations

import gzip
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.sim.workloads import serving as sv
from loom.sim.workloads.serving import (
    DEFAULT_MEAN_RPS,
    PAPER_MINUTE_PEAK_RATIO,
    PAPER_SECOND_PEAK_RATIOS,
    DayShape,
    ServingTrace,
    WindowRule,
)

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROWS = (
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:50.9951690,879,55\n"
    "2023-11-16 18:16:51.3910170,91,16\n"
)


def write(path: Path, text: str, *, gz: bool = False) -> Path:
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def make_trace(arrivals: list[float], duration: float, prompt: int = 100, output: int = 10):
    n = len(arrivals)
    return ServingTrace(
        name="t",
        source="test",
        arrival_s=np.asarray(arrivals, dtype=float),
        prompt_tokens=np.full(n, prompt),
        output_tokens=np.full(n, output),
        duration_s=duration,
    )


@pytest.fixture(scope="module")
def day() -> ServingTrace:
    return sv.synthetic_day(seed=1)


# ---- reader ---------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_reader_round_trip(tmp_path: Path, gz: bool) -> None:
    path = write(tmp_path / ("t.csv.gz" if gz else "t.csv"), HEADER + ROWS, gz=gz)
    trace = sv.read_azure_trace(path)
    assert trace.name == "t"
    assert trace.source == str(path)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.314579, 4.314579, 64.710427], atol=1e-6)
    assert trace.prompt_tokens.tolist() == [374, 396, 879, 91]
    assert trace.output_tokens.tolist() == [44, 109, 55, 16]
    assert trace.duration_s == pytest.approx(64.710427, abs=1e-6)
    assert len(trace) == 4
    assert not trace.arrival_s.flags.writeable


def test_reader_takes_columns_by_name_and_the_2024_timestamps(tmp_path: Path) -> None:
    text = (
        "GeneratedTokens,Extra,TIMESTAMP,ContextTokens\n"
        "5,x,2024-05-10 00:00:00.009930+00:00,2162\n"
        "\n"
        "7,y,2024-05-10 00:00:01.509930+00:00,10\n"
    )
    trace = sv.read_azure_trace(write(tmp_path / "w.csv", text), name="week")
    assert trace.name == "week"
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.5])
    assert trace.prompt_tokens.tolist() == [2162, 10]
    assert trace.output_tokens.tolist() == [5, 7]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty file"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.1,3\n", r":1: missing column.*Generated"),
        (HEADER, "no requests"),
        (HEADER + "yesterday,3,4\n", r":2: unparsable TIMESTAMP 'yesterday'"),
        (HEADER + ROWS + "2023-11-16 18:15:47.0000000,1,1\n", r":6: .* earlier than the line"),
        (HEADER + "2023-11-16 18:15:46.1,-3,4\n", r":2: ContextTokens must be >= 0, got -3"),
        (HEADER + "2023-11-16 18:15:46.1,3,-1\n", r":2: GeneratedTokens must be >= 0"),
        (HEADER + "2023-11-16 18:15:46.1,3.5,1\n", r":2: ContextTokens '3.5' is not an integer"),
        (HEADER + "2023-11-16 18:15:46.1,3\n", r":2: 2 fields, the header has 3"),
        (
            HEADER + "2023-11-16 18:15:46.1,3,1\n2023-11-16 18:15:47.1+00:00,3,1\n",
            r":3: .*aware and naive",
        ),
    ],
)
def test_reader_rejects_malformed_files(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(ConfigError, match=match):
        sv.read_azure_trace(path)


def test_reader_errors_on_gz_too_and_on_missing_or_binary_files(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv.gz", HEADER + "2023-11-16 18:15:46.1,-3,4\n", gz=True)
    with pytest.raises(ConfigError, match=r"bad\.csv\.gz:2: ContextTokens"):
        sv.read_azure_trace(path)
    with pytest.raises(ConfigError, match="no trace file"):
        sv.read_azure_trace(tmp_path / "absent.csv")
    junk = tmp_path / "junk.csv.gz"
    junk.write_bytes(b"\x1f\x8b" + bytes(range(256)))
    with pytest.raises(ConfigError, match="not a readable CSV trace"):
        sv.read_azure_trace(junk)


def test_trace_validates_its_arrays() -> None:
    with pytest.raises(ConfigError, match="non-decreasing"):
        make_trace([2.0, 1.0], 3.0)
    with pytest.raises(ConfigError, match="outside"):
        make_trace([0.0, 5.0], 3.0)
    with pytest.raises(ConfigError, match="must match"):
        ServingTrace(
            name="x",
            source="y",
            arrival_s=np.zeros(2),
            prompt_tokens=np.zeros(1, dtype=int),
            output_tokens=np.zeros(2, dtype=int),
            duration_s=1.0,
        )


# ---- vendored traces ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "requests", "span_s"), [("conv", 19_366, 3501.721937), ("code", 8_819, 3435.948056)]
)
def test_vendored_azure_2023(kind: str, requests: int, span_s: float) -> None:
    trace = sv.azure_2023(kind)
    assert len(trace) == requests
    assert trace.duration_s == pytest.approx(span_s, abs=1e-6)
    assert trace.arrival_s[0] == 0.0
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.prompt_tokens.min() > 0 and trace.output_tokens.min() > 0
    assert "CC BY 4.0" in trace.source and "Splitwise" in trace.source


def test_vendored_data_ships_in_the_package() -> None:
    data = resources.files("loom.sim.workloads").joinpath("data")
    with data.joinpath("AzureLLMInferenceTrace_conv.csv.gz").open("rb") as f:
        first = gzip.decompress(f.read()).splitlines()[:2]  # CRLF, as published
    assert first == [
        b"TIMESTAMP,ContextTokens,GeneratedTokens",
        b"2023-11-16 18:15:46.6805900,374,44",
    ]
    notice = data.joinpath("README.md").read_text(encoding="utf-8")
    assert "CC BY 4.0" in notice and "Splitwise" in notice and "ISCA 2024" in notice
    with pytest.raises(ConfigError, match="unknown Azure 2023 trace 'chat'"):
        sv.azure_2023("chat")


def test_conversation_trace_statistics() -> None:
    s = sv.summarize(sv.azure_2023("conv"))
    assert s.mean_rps == pytest.approx(5.53, abs=0.01)
    assert (s.prompt_p50, s.output_p50) == (1020.0, 129.0)
    assert s.prefill_share == pytest.approx(0.845, abs=0.001)


# ---- the synthetic day: calibration to Fig. 3a ----------------------------------------------
def test_minute_peak_ratio_matches_fig3a_at_seed_1(day: ServingTrace) -> None:
    assert len(day) == pytest.approx(DEFAULT_MEAN_RPS * 86_400, rel=0.01)
    assert sv.minute_peak_ratio(day) == pytest.approx(PAPER_MINUTE_PEAK_RATIO, rel=0.10)


@pytest.mark.parametrize("seed", [2, 3, 4, 5])
def test_minute_peak_ratio_matches_fig3a_across_seeds(seed: int) -> None:
    trace = sv.synthetic_day(seed=seed)
    assert sv.minute_peak_ratio(trace) == pytest.approx(PAPER_MINUTE_PEAK_RATIO, rel=0.10)


def test_second_level_bursts_span_fig3a(day: ServingTrace) -> None:
    ratios = sv.second_peak_ratios(day)
    assert len(ratios) == 288  # 5-minute windows in a day
    # Calm windows peak at ~1.6-1.75x their mean (Fig. 3a: 1.58, 1.73) ...
    assert 1.55 <= np.median(ratios) <= 1.95
    assert ratios.min() <= min(PAPER_SECOND_PEAK_RATIOS)
    # ... and a few surge to Fig. 3a's 4.22x, without absurd outliers.
    assert 0.9 * max(PAPER_SECOND_PEAK_RATIOS) <= ratios.max() <= 8.0
    assert 0.0 < np.mean(ratios > 3.0) <= 0.15


def test_density_scales_the_rate_and_keeps_the_shape() -> None:
    hours = 6.0
    base = sv.synthetic_day(hours=hours, seed=3)
    norm = sv._binned(base, 60.0) / sv._binned(base, 60.0).mean()
    for density in (1.5, 2.0):
        dense = sv.synthetic_day(hours=hours, seed=3, density=density)
        expected = density * len(base)
        assert abs(len(dense) - expected) <= 5 * math.sqrt(expected)
        dense_norm = sv._binned(dense, 60.0) / sv._binned(dense, 60.0).mean()
        assert np.corrcoef(norm, dense_norm)[0, 1] > 0.97
        assert np.max(np.abs(norm - dense_norm)) < 0.2
        assert sv.minute_peak_ratio(dense) == pytest.approx(sv.minute_peak_ratio(base), rel=0.05)
        # a denser day holds every request of the density-1 day
        assert np.all(np.isin(base.arrival_s, dense.arrival_s))
    thin = sv.synthetic_day(hours=hours, seed=3, density=0.5)
    assert np.all(np.isin(thin.arrival_s, base.arrival_s))
    assert abs(len(thin) - 0.5 * len(base)) <= 5 * math.sqrt(len(base))


def test_same_seed_same_arrays_other_seed_other_arrays() -> None:
    a = sv.synthetic_day(hours=1.0, seed=7, density=1.5)
    b = sv.synthetic_day(hours=1.0, seed=7, density=1.5)
    c = sv.synthetic_day(hours=1.0, seed=8, density=1.5)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_s[:100], c.arrival_s[:100])
    assert np.array_equal(sv.intensity(2.0, seed=7), sv.intensity(2.0, seed=7))


def test_sizes_are_resampled_jointly_from_the_conversation_trace() -> None:
    conv = sv.azure_2023("conv")
    pairs = set(zip(conv.prompt_tokens.tolist(), conv.output_tokens.tolist(), strict=True))
    trace = sv.synthetic_day(hours=0.5, seed=2)
    drawn = zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=True)
    assert all(pair in pairs for pair in drawn)
    assert sv.prefill_share(trace) == pytest.approx(sv.prefill_share(conv), abs=0.02)


def test_default_rate_is_fig3b_utilisation_on_a_roofline() -> None:
    assert sv.rps_at_utilisation() == pytest.approx(DEFAULT_MEAN_RPS, rel=0.02)
    # linear in utilisation and GPUs
    assert sv.rps_at_utilisation(0.378, gpus=8) == pytest.approx(2 * sv.rps_at_utilisation())
    with pytest.raises(ConfigError, match="utilisation"):
        sv.rps_at_utilisation(0.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mean_rps": 0.0}, "mean_rps must be > 0"),
        ({"density": -1.0}, "density must be > 0"),
        ({"hours": 0.0}, "hours must be in"),
        ({"hours": 1000.0}, "hours must be in"),
        ({"shape": None, "sizes": make_trace([], 0.0)}, "no requests to draw sizes"),
    ],
)
def test_synthetic_day_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        sv.synthetic_day(**kwargs)


def test_day_shape_validates() -> None:
    with pytest.raises(ConfigError, match="diurnal_amplitude"):
        DayShape(diurnal_amplitude=1.0)
    with pytest.raises(ConfigError, match="second_shape must be > 0"):
        DayShape(second_shape=0.0)
    with pytest.raises(ConfigError, match="spikes_per_hour must be >= 0"):
        DayShape(spikes_per_hour=-1.0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hours=st.floats(min_value=0.01, max_value=2.0),
    mean_rps=st.floats(min_value=0.5, max_value=40.0),
    density=st.floats(min_value=0.25, max_value=3.0),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_any_parameters_give_a_valid_trace(
    hours: float, mean_rps: float, density: float, seed: int
) -> None:
    trace = sv.synthetic_day(mean_rps=mean_rps, hours=hours, density=density, seed=seed)
    span = hours * 3600.0
    t = trace.arrival_s
    assert trace.duration_s == span
    assert np.all(np.diff(t) >= 0)
    assert len(t) == 0 or (t[0] >= 0.0 and t[-1] < span)
    assert np.all(trace.prompt_tokens > 0) and np.all(trace.output_tokens > 0)
    # The rate is rescaled so that the span's expected count is exactly N, and the count is
    # then Poisson(N) (thinning and superposing Poisson processes stay Poisson): a 5-sigma band
    # (plus one for small N) fails with probability < 1e-6 per example.
    expected = mean_rps * density * span
    assert abs(len(t) - expected) <= 5.0 * math.sqrt(expected) + 1.0


# ---- slices ---------------------------------------------------------------------------------
def test_window_cuts_and_rebases() -> None:
    trace = make_trace([0.0, 1.0, 2.5, 3.0, 9.0], 10.0)
    part = sv.window(trace, 1.0, 2.0)
    assert part.arrival_s.tolist() == [0.0, 1.5]
    assert part.duration_s == 2.0
    with pytest.raises(ConfigError, match="runs past"):
        sv.window(trace, 9.0, 2.0)
    with pytest.raises(ConfigError, match="start must be >= 0"):
        sv.window(trace, -1.0, 2.0)


def test_named_windows_of_the_day(day: ServingTrace) -> None:
    counts = {}
    for rule in WindowRule:
        start = sv.find_window(day, rule, 3600.0)
        assert start % 60 == 0 and 0 <= start <= 23 * 3600
        counts[rule] = len(sv.named_window(day, rule, 3600.0))
    assert counts[WindowRule.QUIETEST] < counts[WindowRule.MEAN] < counts[WindowRule.BUSIEST]
    assert counts[WindowRule.MEAN] == pytest.approx(DEFAULT_MEAN_RPS * 3600, rel=0.01)
    # the busy hour is around the diurnal peak (14:00 by default)
    assert 11 * 3600 <= sv.find_window(day, "busiest") <= 15 * 3600
    with pytest.raises(ConfigError, match="unknown window rule 'peak'"):
        sv.find_window(day, "peak")


# ---- statistics and the plot ----------------------------------------------------------------
def test_statistics_on_a_hand_built_trace() -> None:
    # minute 0: 1 request, minute 1: 3 requests (two in one second); 30 s left over
    trace = make_trace([5.0, 61.0, 62.2, 62.7, 140.0], 150.0, prompt=30, output=10)
    assert sv.mean_rate(trace) == pytest.approx(5 / 150)
    assert sv.minute_peak_ratio(trace) == pytest.approx(3 / 2)
    assert sv.second_peak_ratios(trace, window_s=60).tolist() == pytest.approx([60.0, 40.0])
    assert sv.prefill_share(trace) == pytest.approx(0.75)
    q = sv.token_quantiles(trace, (0.5,))
    assert q["prompt"].tolist() == [30.0] and q["output"].tolist() == [10.0]
    with pytest.raises(ConfigError, match="less than one 60-s bin"):
        sv.minute_peak_ratio(make_trace([1.0], 30.0))
    with pytest.raises(ConfigError, match="whole number of seconds"):
        sv.second_peak_ratios(trace, window_s=0.5)


def test_plot_fig3a_writes_a_png(tmp_path: Path) -> None:
    trace = sv.synthetic_day(hours=1.0, seed=1)
    out = sv.plot_fig3a(trace, tmp_path / "fig" / "fig3a.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="between 1 and 6 windows"):
        sv.plot_fig3a(trace, tmp_path / "x.png", windows=[])
