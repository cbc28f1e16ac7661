"""The progress bar over a benchmark's runs: it counts what is done, names what runs, and
leaves a redirected stdout alone."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from loom.bench.progress import RunProgress


def test_counts_and_names_the_runs(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RunProgress(4, "runs", console=console) as bar:
        bar.step("coding heddle #0")
        bar.advance()
        bar.advance(2)
        assert bar.completed == 3 and bar.total == 4
        print("a table line")
        bar.update(10)  # never past the total
        assert bar.completed == 4
    drawn = out.getvalue()
    assert "runs: coding heddle #0" in drawn and "4/4" in drawn and "left" in drawn
    assert capsys.readouterr().out == "a table line\n"  # stdout is no terminal here


def test_a_negative_total_is_refused() -> None:
    with pytest.raises(ValueError, match="total must be >= 0"):
        RunProgress(-1, "runs")
