"""Spec tables load with a source for every number; unknown names fail with the known ones."""

from __future__ import annotations

import dataclasses

import pytest

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.perf import gpu_spec, list_gpus, list_models, load_calibration, model_spec


def _numeric_fields(spec: object) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(spec)  # type: ignore[arg-type]
        if isinstance(getattr(spec, f.name), int | float) and f.name != "gpu"
    ]


@pytest.mark.parametrize("gpu", list(GpuType))
def test_every_gpu_type_has_a_sourced_spec(gpu: GpuType) -> None:
    spec = gpu_spec(gpu)
    assert spec.gpu is gpu
    for name in _numeric_fields(spec):
        assert getattr(spec, name) > 0
        assert spec.sources[name].strip(), f"{gpu}.{name} has no source"
    assert spec.nvlink_gbs < spec.hbm_bw_tbs * 1e3


def test_gpu_lookup_accepts_values_and_case() -> None:
    assert gpu_spec("H100") == gpu_spec(GpuType.H100)
    assert set(list_gpus()) == set(GpuType)


def test_prices_only_from_the_seed_papers() -> None:
    assert gpu_spec("h20").price_per_h == pytest.approx(1.85)
    assert gpu_spec("h800").price_per_h == pytest.approx(5.28)
    assert "seed 001" in gpu_spec("h20").sources["price_per_h"]
    assert gpu_spec("h100").price_per_h is None


MOE_FIELDS = ("num_experts", "experts_per_token", "moe_intermediate_size", "active_params_b")


@pytest.mark.parametrize("name", list_models())
def test_every_model_has_a_sourced_spec(name: str) -> None:
    spec = model_spec(name)
    for field in _numeric_fields(spec):
        if field in MOE_FIELDS and not spec.is_moe:
            assert not getattr(spec, field), f"dense {name} has {field}"
            continue
        assert getattr(spec, field) > 0
        assert spec.sources[field].strip(), f"{name}.{field} has no source"
    assert spec.num_heads % spec.num_kv_heads == 0
    assert spec.weight_bytes == pytest.approx(2 * spec.params_b * 1e9)


def test_model_lookup_and_derived_sizes() -> None:
    assert {"qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen2.5-7b"} <= set(list_models())
    m = model_spec("Qwen/Qwen3-8B")
    assert (m.num_layers, m.hidden_size, m.num_kv_heads, m.vocab_size) == (36, 4096, 8, 151936)
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2  # 144 KiB
    assert m.flops_per_token == pytest.approx(2 * 8.19e9)


def test_calibration_is_sourced_and_estimates_say_so() -> None:
    cal = load_calibration()
    for name in _numeric_fields(cal):
        assert cal.sources[name].strip()
    assert "estimate" in cal.sources["iteration_overhead_s"].lower()
    assert 0 < cal.prefill_mfu <= 1 and 0 < cal.decode_mbu <= 1


@pytest.mark.parametrize(
    ("lookup", "bad", "known"),
    [
        (gpu_spec, "b200", "h100"),
        (model_spec, "llama-8b", "qwen3-8b"),
        (load_calibration, "fast", "default"),
    ],
)
def test_unknown_names_list_the_known_ones(lookup, bad: str, known: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown .*{bad}.*{known}"):
        lookup(bad)


def test_a_mixture_of_experts_counts_its_active_parameters() -> None:
    m = model_spec("qwen3-30b-a3b")
    assert m.is_moe and (m.num_experts, m.experts_per_token) == (128, 8)
    assert m.flops_per_token == pytest.approx(2 * 3.3e9)  # the active ones
    assert m.weight_bytes == pytest.approx(2 * 30.5e9)  # every expert is stored
    assert model_spec("qwen3-235b-a22b").active_params_b == 22.0
