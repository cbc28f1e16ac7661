"""The benchmark's batch: Heddle's workload scaled and capped, deterministic under its seed,
its tokens drawn once, its history written as the router reads it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loom.bench.batch import (
    VOCAB,
    BatchConfig,
    batch_size,
    draw_tokens,
    history_specs,
    scaled_batch,
    to_spec,
    write_history,
)
from loom.core.errors import ConfigError
from loom.rollout.history import read_history
from loom.runtime.rollout.prediction import HISTORY_FILE

CONFIG = BatchConfig(prompts=3, samples=2, max_turn_tokens=40, max_turns=4, history=2)


def test_scaled_and_capped_from_the_workload() -> None:
    batch = scaled_batch(CONFIG)
    original = {s.traj_id: s for s in CONFIG.workload().sample(100 + CONFIG.seed)}
    assert len(batch) == 6
    for spec, turns in batch:
        assert spec is not None and 1 <= len(turns) <= 4
        src = original[spec.traj_id].turns
        for turn, raw in zip(turns, src, strict=False):
            assert turn.input_tokens == max(1, min(40, round(raw.input_tokens * 0.05)))
            assert turn.output_tokens == max(1, min(40, round(raw.output_tokens * 0.05)))
        for turn, raw in zip(turns[:-1], src, strict=False):
            assert raw.tool_latency_s is not None
            assert turn.tool_s == pytest.approx(raw.tool_latency_s * 0.05)
        assert turns[-1].tool_s is None  # the last turn (also one cut at max_turns) ends it


def test_deterministic_under_the_seed() -> None:
    assert scaled_batch(CONFIG) == scaled_batch(CONFIG)
    assert scaled_batch(CONFIG) != scaled_batch(replace(CONFIG, seed=2))
    assert scaled_batch(CONFIG, epoch=0) != scaled_batch(CONFIG)  # another epoch's samples


def test_batch_size() -> None:
    batch = scaled_batch(CONFIG)
    n, turns, tokens = batch_size(batch)
    assert n == 6
    assert turns == sum(len(t) for _, t in batch)
    assert tokens == sum(x.output_tokens for _, t in batch for x in t)


def test_tokens_drawn_per_turn_the_same_every_time() -> None:
    batch = scaled_batch(CONFIG)
    draws = draw_tokens(batch, seed=1)
    assert draws == draw_tokens(batch, seed=1)
    assert draws != draw_tokens(batch, seed=2)
    for spec, turns in batch:
        got = draws[spec.traj_id]
        assert [len(d) for d in got] == [t.input_tokens for t in turns]
        assert all(3 <= x < VOCAB for d in got for x in d)


def test_the_history_as_the_router_and_the_simulator_read_it(tmp_path: Path) -> None:
    n = write_history(CONFIG, tmp_path / "state")
    records = read_history(tmp_path / "state" / HISTORY_FILE)
    assert n == len(records) == 12  # two epochs of six
    specs = history_specs(CONFIG)
    assert len(specs) == 12
    epoch0 = scaled_batch(CONFIG, 0)
    assert specs[: len(epoch0)] == [to_spec(s, t) for s, t in epoch0]
    # what the router's predictor reads back is what the simulator's learns from
    assert [
        [(t.input_tokens, t.output_tokens, t.tool_latency_s) for t in r.turns] for r in records
    ] == [[(t.input_tokens, t.output_tokens, t.tool_latency_s) for t in s.turns] for s in specs]
    assert [r.prompt_features for r in records] == [s.prompt_features for s in specs]


def test_to_spec_keeps_the_scaled_turns() -> None:
    spec, turns = scaled_batch(CONFIG)[0]
    got = to_spec(spec, turns)
    assert [(t.input_tokens, t.output_tokens, t.tool_latency_s) for t in got.turns] == [
        (t.input_tokens, t.output_tokens, t.tool_s) for t in turns
    ]
    assert got.prompt_features == (float(turns[0].input_tokens),)


@pytest.mark.parametrize(
    "bad", [{"prompts": 0}, {"max_turns": 0}, {"token_scale": 0.0}, {"history": -1}]
)
def test_a_bad_batch_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BatchConfig(**bad)  # type: ignore[arg-type]
