"""Tables a person can read: no value is ever cut. Narrow or piped output is tidy CSV with
every value whole; a terminal wide enough gets a table whose cells wrap."""

from __future__ import annotations

import csv
import io

from rich.console import Console

from loom.experiments.report import print_tables

RECORDS = [
    {
        "experiment": "fig12",
        "system": "heddle",
        "policy": p,
        "workload": "coding",
        "model": "qwen3-14b",
        "throughput_tok_s": 12345.678 + i,
        "longest_queueing_delay_s": 1.23,
    }
    for i, p in enumerate(("heddle", "verl_star"))
]


def _print(**console: object) -> str:
    out = io.StringIO()
    print_tables(RECORDS, Console(file=out, color_system=None, **console), "heddle")  # type: ignore[arg-type]
    return out.getvalue()


def test_piped_output_is_csv_with_every_value_whole() -> None:
    text = _print(width=30)
    assert text.startswith("# heddle fig12\n")
    rows = list(csv.DictReader(io.StringIO(text.split("\n", 1)[1])))
    assert [r["policy"] for r in rows] == ["heddle", "verl_star"]
    assert rows[1]["longest_queueing_delay_s"] == "1.23" and rows[0]["model"] == "qwen3-14b"


def test_a_narrow_terminal_gets_csv_and_a_wide_one_an_uncut_table() -> None:
    assert _print(width=40, force_terminal=True).startswith("# heddle fig12")
    wide = _print(width=120, force_terminal=True)
    assert "…" not in wide and "verl_star" in wide and "qwen3-14b" in wide
    assert "12346.68" not in wide and "1.235e+04" in wide  # the format, whole
