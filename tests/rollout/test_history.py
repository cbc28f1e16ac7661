"""The history format: records round-trip through JSON lines and map onto TrajectorySpec."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.history import (
    TrajectoryRecord,
    read_history,
    read_records,
    spec_id,
    write_history,
)

finite = st.floats(allow_nan=False, allow_infinity=False)
latency = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@st.composite
def specs(draw: st.DrawFn) -> TrajectorySpec:
    n = draw(st.integers(1, 5))
    turns = tuple(
        TurnSpec(
            input_tokens=draw(st.integers(0, 10**6)),
            output_tokens=draw(st.integers(1, 10**6)),
            tool_latency_s=draw(latency) if i < n - 1 else None,
        )
        for i in range(n)
    )
    return TrajectorySpec(
        traj_id=draw(st.integers(0, 2**63 - 1)),
        prompt_id=draw(st.integers(0, 2**63 - 1)),
        sample_idx=draw(st.integers(0, 1000)),
        workload=draw(st.sampled_from([None, *WorkloadKind])),
        turns=turns,
        prompt_features=tuple(draw(st.lists(finite, max_size=4))),
    )


@given(specs())
def test_spec_round_trips_through_a_json_line(spec: TrajectorySpec) -> None:
    line = TrajectoryRecord.from_spec(spec).model_dump_json()
    assert "\n" not in line
    assert TrajectoryRecord.model_validate_json(line).to_spec() == spec


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40), specs())
def test_record_with_any_ids_round_trips(traj: str, prompt: str, spec: TrajectorySpec) -> None:
    record = TrajectoryRecord.from_spec(spec).model_copy(
        update={"trajectory_id": traj, "prompt_id": prompt}
    )
    again = TrajectoryRecord.model_validate_json(record.model_dump_json())
    assert again == record
    assert again.to_spec().prompt_id == spec_id(prompt)


def test_ids_map_to_integers_stably() -> None:
    assert spec_id("0") == 0
    assert spec_id("42") == 42
    assert spec_id(str(2**63 - 1)) == 2**63 - 1
    for text in ("007", "-3", "prompt-a", str(2**63), " 1"):
        assert -(2**63) <= spec_id(text) < 0, text
    assert spec_id("prompt-a") == spec_id("prompt-a") != spec_id("prompt-b")


def test_numbers_are_accepted_as_ids() -> None:
    line = (
        '{"trajectory_id": 7, "prompt_id": 3, "turns": [{"input_tokens": 5, "output_tokens": 2}]}'
    )
    record = TrajectoryRecord.model_validate_json(line)
    assert (record.trajectory_id, record.prompt_id) == ("7", "3")
    spec = record.to_spec()
    assert (spec.traj_id, spec.prompt_id, spec.workload, spec.prompt_features) == (7, 3, None, ())


def test_file_round_trip_and_append(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    one = TrajectorySpec(
        traj_id=1,
        prompt_id=9,
        sample_idx=0,
        workload=WorkloadKind.MATH,
        turns=(TurnSpec(100, 20, 0.5), TurnSpec(30, 40, None)),
        prompt_features=(100.0,),
    )
    two = TrajectorySpec(
        traj_id=2, prompt_id=9, sample_idx=1, workload=None, turns=(TurnSpec(100, 5, None),)
    )
    assert write_history(path, [one]) == 1
    assert write_history(path, [TrajectoryRecord.from_spec(two)], append=True) == 1
    assert read_history(path) == [one, two]
    path.write_text("\n\n")
    assert read_records(path) == []


GOOD = (
    '{"trajectory_id": "a", "prompt_id": "p", "turns": [{"input_tokens": 1, "output_tokens": 1}]}'
)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("not json", "Invalid JSON"),
        ("[1, 2]", "object"),
        ('{"trajectory_id": "a", "prompt_id": "p", "turns": []}', "turns"),
        ('{"trajectory_id": "", "prompt_id": "p", "turns": [{}]}', "trajectory_id"),
        ('{"trajectory_id": "a", "prompt_id": "p", "turns": [{"input_tokens": 1}]}', "output"),
        (GOOD.replace('"output_tokens": 1', '"output_tokens": 0'), "greater than or equal"),
        (GOOD.replace("}]}", ', "tool_latency_s": 2.0}]}'), "last turn"),
        (GOOD.replace("}]}", ', "tool_latency_s": NaN}]}'), "finite"),
        (GOOD.replace('"turns"', '"turn_count": 1, "turns"'), "turn_count"),
        (GOOD.replace('"turns"', '"workload": "chess", "turns"'), "workload"),
        (
            '{"trajectory_id": "a", "prompt_id": "p", "turns": [{"input_tokens": 1, '
            '"output_tokens": 1}, {"input_tokens": 1, "output_tokens": 1}]}',
            "every turn but the last",
        ),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path: Path, bad: str, message: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(f"{GOOD}\n\n{bad}\n{GOOD}\n")
    with pytest.raises(ConfigError, match=rf"h\.jsonl:3: .*{message}"):
        read_history(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read history"):
        read_history(tmp_path / "none.jsonl")
