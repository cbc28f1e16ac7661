"""ROSE Fig. 10 transfer model: variant order, real codec bytes, bandwidth, shard coverage,
calibration, determinism and bad input."""

import itertools
import math

import numpy as np
import pytest

from loom.core.errors import ConfigError
from loom.experiments import rose_transfer as rt
from loom.state.weights import encode, header_nbytes, model_params

MODELS = ("qwen3-8b", "qwen3-32b")


@pytest.fixture
def fresh_samples():
    """Forget cached codec samples before and after, so a test sees (and leaves) real encodes."""
    rt.codec_sample.cache_clear()
    yield
    rt.codec_sample.cache_clear()


@pytest.mark.parametrize("model", MODELS)
def test_variants_get_no_slower_in_order_at_200_gbps(model):
    times = [rt.transfer_time_s(model, v) for v in rt.Variant]
    assert all(a > b for a, b in itertools.pairwise(times)), times


@pytest.mark.parametrize("model", MODELS)
def test_sparse_bytes_are_the_codecs_encoded_size(model):
    seed, nnz, rows = 7, 0.05, rt.SAMPLE_ROWS[True]
    sample = rt.codec_sample(model, nnz, seed=seed, rows=rows)
    rng = np.random.default_rng(seed)
    encoded = 0
    for shape in sample.shapes:
        old, new = rt.delta_pair(shape, nnz, rng)
        encoded += len(encode(new, old=old, version=1, base_version=0))
    assert sample.encoded_nbytes == encoded
    assert sum(sample.blob_nbytes(s) for s in sample.shapes) == pytest.approx(encoded, abs=20)
    # Every piece of the plan ships as the sampled blob size for its shape.
    est = rt.estimate(model, "sparse", nnz_fraction=nnz, seed=seed)
    pieces = rt.transfer_plan(model).pieces
    assert est.bytes_sent == sum(sample.blob_nbytes(p.box.shape) for p in pieces)
    assert 5.5 * nnz < sample.payload_per_element < 6.5 * nnz  # int32 index + bf16 value


def test_sparse_bytes_follow_the_codec_not_a_factor(monkeypatch, fresh_samples):
    before = rt.estimate("qwen3-8b", "sparse", seed=1).bytes_sent
    rt.codec_sample.cache_clear()
    monkeypatch.setattr(rt, "encode", lambda *a, **k: encode(*a, **k) + bytes(4096))
    assert rt.estimate("qwen3-8b", "sparse", seed=1).bytes_sent > before


def test_above_the_dense_threshold_sparse_ships_dense_bytes():
    dense = rt.estimate("qwen3-8b", "shard")
    fallback = rt.estimate("qwen3-8b", "sparse", nnz_fraction=0.3)
    assert fallback.bytes_sent == dense.bytes_sent
    assert fallback.transfer_s >= dense.transfer_s  # plus D2S and S2D, for nothing


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", ["shard", "sparse"])
def test_time_grows_as_bandwidth_drops(model, variant):
    times = [
        rt.transfer_time_s(model, variant, bandwidth_gbps=bw)
        for bw in sorted(rt.BANDWIDTHS_GBPS, reverse=True)
    ]
    assert all(a <= b for a, b in itertools.pairwise(times)), times
    assert times[-1] > 2 * times[0]


@pytest.mark.parametrize("model", MODELS)
def test_shard_ranks_send_every_element_once(model):
    setup = rt.transfer_setup(model)
    plan = rt.transfer_plan(model)
    numel = sum(p.numel for p in model_params(model))
    ranks = setup.train.ranks()
    assert len(ranks) == setup.train_gpus
    assert sum(p.numel for r in ranks for p in plan.pieces_from(r)) == numel
    vol = rt.volumes(setup, rt.FEATURES[rt.Variant.SHARD], None)
    headers = sum(header_nbytes(len(p.box.shape)) for p in plan.pieces)
    assert vol.bytes_sent == sum(s.sent_bytes for s in vol.streams) == 2 * numel + headers
    assert headers < 1e-5 * numel
    # DP (and CP) replicas split the work: the busiest rank sends within 2% of an even share.
    assert max(s.sent_bytes for s in vol.streams) < 1.02 * vol.bytes_sent / len(ranks)


def test_32b_layout_gives_app_f_sixty_buckets_per_worker():
    vol = rt.volumes(rt.transfer_setup("qwen3-32b"), rt.FEATURES[rt.Variant.SHARD], None)
    buckets = [s.sent_bytes / rt.relay().bucket_bytes for s in vol.streams]
    assert all(55 < b < 65 for b in buckets), buckets


def test_calibration_reproduces_app_f_timeline():
    est = rt.estimate("qwen3-32b", "shard")
    assert est.push_bound == "node"
    assert est.push_s == pytest.approx(65.0)
    assert est.pull_s == pytest.approx(42.0)


def test_records_follow_the_contract_and_are_deterministic(fresh_samples):
    a = rt.fig10_records(3, True)
    rt.codec_sample.cache_clear()
    b = rt.fig10_records(3, True)
    assert a == b
    fig10 = [r for r in a if r["experiment"] == "fig10"]
    fig10b = [r for r in a if r["experiment"] == "fig10b"]
    assert len(fig10) == len(MODELS) * len(rt.Variant)
    assert len(fig10b) == len(MODELS) * 2 * len(rt.BANDWIDTHS_GBPS)
    for r in fig10:
        assert {"policy", "model", "transfer_s", "bytes_sent", "speedup_vs_batch"} <= set(r)
        assert {"paper_speedup", "paper_transfer_s"} <= set(r)
        assert math.isfinite(r["transfer_s"]) and r["transfer_s"] > 0
    assert {r["policy"] for r in fig10b} == {"shard", "sparse"}
    assert {r["bandwidth_gbps"] for r in fig10b} == set(rt.BANDWIDTHS_GBPS)
    other = rt.fig10_records(4, True)
    sparse = [(r["bytes_sent"], o["bytes_sent"]) for r, o in zip(a, other, strict=True)]
    assert any(x != y for x, y in sparse), "the seed draws the sampled deltas"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "llama-70b", "variant": "shard"}, "unknown model 'llama-70b'"),
        ({"model": "qwen3-8b", "variant": "zip"}, "unknown transfer variant 'zip'"),
        ({"model": "qwen3-8b", "variant": "shard", "bandwidth_gbps": 0}, "must be > 0"),
        ({"model": "qwen3-8b", "variant": "shard", "bandwidth_gbps": -5.0}, "must be > 0"),
        ({"model": "qwen3-8b", "variant": "shard", "bandwidth_gbps": math.nan}, "finite"),
        ({"model": "qwen3-8b", "variant": "sparse", "nnz_fraction": 1.5}, r"in \[0, 1\]"),
    ],
)
def test_bad_input_raises_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        rt.transfer_time_s(**kwargs)
