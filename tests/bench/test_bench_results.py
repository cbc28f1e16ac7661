"""The results document: built with what ran, written as strict JSON, read back, and a file
that is not one refused with what is wrong with it."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from loom.bench.results import (
    ResultsError,
    command_line,
    git_commit,
    host,
    read_results,
    results,
    write_results,
)

RECORDS = [
    {"record": "run", "system": "heddle", "repeat": 0, "makespan_s": 12.5},
    {"record": "system", "system": "heddle", "makespan_runs_s": [12.5, 13.0], "sim_s": None},
]


def test_the_envelope_says_what_ran() -> None:
    when = datetime(2026, 11, 27, 13, 5, 9, tzinfo=timezone(timedelta(hours=2)))
    doc = results("bench_x", RECORDS, seed=7, command="python bench_x.py --seed 7", date=when)
    assert list(doc) == ["benchmark", "command", "date", "seed", "commit", "host", "records"]
    assert doc["benchmark"] == "bench_x"
    assert doc["command"] == "python bench_x.py --seed 7"
    assert doc["date"] == "2026-11-27T11:05:09Z"  # in UTC
    assert doc["seed"] == 7
    assert doc["host"] == host()
    assert doc["host"]["cpus"] >= 1 and doc["host"]["platform"]
    assert doc["records"] == RECORDS


def test_the_command_is_the_argv_as_run_quoted_for_a_shell() -> None:
    argv = ["benchmarks/bench_rollout_runtime.py", "--systems", "heddle,verl*", "--peers", ""]
    assert command_line(argv) == (
        "python benchmarks/bench_rollout_runtime.py --systems 'heddle,verl*' --peers ''"
    )
    assert command_line().startswith("python ")  # this process's own
    # Loom's console script, or `python -m loom.cli`, reads as the command a user types
    loom = ["/venv/bin/loom", "reproduce", "heddle", "--quick"]
    assert command_line(loom) == "loom reproduce heddle --quick"
    module = ["/src/loom/cli/__main__.py", "reproduce", "rose"]
    assert command_line(module) == "loom reproduce rose"


def test_the_commit_is_git_head_or_none(tmp_path: Path) -> None:
    here = Path(__file__).parent
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=False
    )
    expected = head.stdout.strip() if head.returncode == 0 else None
    assert git_commit(here) == expected
    assert git_commit(tmp_path) is None  # no checkout there


def test_round_trip(tmp_path: Path) -> None:
    doc = results("bench_x", RECORDS, seed=1, commit="abc123")
    path = write_results(tmp_path / "out" / "r.json", doc)
    assert path.exists()
    assert read_results(path) == doc


def test_values_that_strict_json_lacks_are_null_and_numpy_numbers_plain(tmp_path: Path) -> None:
    records = [
        {"ratio": float("nan"), "big": float("inf"), "n": np.int64(3), "x": np.float32(0.5)},
        {"runs_s": (1.0, float("nan"))},
    ]
    path = write_results(tmp_path / "r.json", results("b", records, seed=0))
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    got = read_results(path)["records"]
    assert got == [{"ratio": None, "big": None, "n": 3, "x": 0.5}, {"runs_s": [1.0, None]}]
    assert type(got[0]["n"]) is int


def test_a_record_that_is_not_flat_is_refused() -> None:
    with pytest.raises(ResultsError, match=r"record 0: engine is \{'busy_s': 1\.0\}"):
        results("b", [{"engine": {"busy_s": 1.0}}], seed=0)
    with pytest.raises(ResultsError, match=r"record 1: runs is \[1\]"):
        results("b", [{}, {"runs": [[1]]}], seed=0)


def _valid() -> dict[str, object]:
    # NOTE: fixed date and commit: the cases are test ids, the same in every test process
    when = datetime(2026, 1, 1, tzinfo=UTC)
    return results("b", RECORDS, seed=1, command="python b.py", date=when, commit="abc123")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"r\.json: not JSON: "),
        ("[1, 2]", r"r\.json: expected a JSON object, got list"),
        (json.dumps({**_valid(), "records": None}), r"records must be a list, got NoneType"),
        (json.dumps({k: v for k, v in _valid().items() if k != "seed"}), r"missing seed"),
        (json.dumps({**_valid(), "seed": "1"}), r"seed must be an integer, got '1'"),
        (json.dumps({**_valid(), "date": "yesterday"}), r"date 'yesterday' is not ISO 8601"),
        (json.dumps({**_valid(), "commit": 5}), r"commit must be a string or null, got 5"),
        (json.dumps({**_valid(), "benchmark": ""}), r"benchmark must be a non-empty string"),
        (json.dumps({**_valid(), "host": []}), r"host must be an object"),
        (json.dumps({**_valid(), "extra": 1}), r"unknown field\(s\) extra"),
        (json.dumps({**_valid(), "records": [1]}), r"record 0 is not an object: 1"),
        (
            json.dumps({**_valid(), "records": [{"a": 1}, {"b": {"c": 2}}]}),
            r"record 1: b is \{'c': 2\}",
        ),
    ],
)
def test_a_malformed_file_says_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ResultsError, match=message) as err:
        read_results(path)
    assert str(path) in str(err.value)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match=r"nope\.json: cannot read"):
        read_results(tmp_path / "nope.json")


def test_a_malformed_document_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    with pytest.raises(ResultsError, match="seed must be an integer"):
        write_results(path, {**_valid(), "seed": None})
    assert not path.exists()


def test_the_date_defaults_to_now_in_utc() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    got = datetime.fromisoformat(results("b", [], seed=0)["date"])
    assert got.tzinfo is not None and got.utcoffset() == timedelta(0)
    assert before <= got <= datetime.now(UTC)
