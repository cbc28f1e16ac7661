"""`loom` as a user types it, in this process or in a fresh one, and what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from typer.testing import CliRunner, Result

from loom.cli import app

# wide enough that rich wraps no line: a one-line message stays one line
ENV = {"COLUMNS": "1000", "LOOM_TOKEN": None}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=ENV)


def flat(output: str) -> str:
    """The output without rich's borders, its words separated by single spaces."""
    for border in "│╭╰╮╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


def error_lines(output: str) -> list[str]:
    """The lines of the error panel, without its borders."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("╭─ Error"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
    return [line.strip("│ ").strip() for line in lines[start + 1 : end]]


def listed(help_output: str, option: str) -> list[str]:
    """The values `option`'s help says it accepts ("one of: a, b, c")."""
    text = flat(help_output)
    match = re.search(rf"(?:^| ){re.escape(option)} .*?one of: ([^;)]*)", text)
    assert match is not None, f"{option} lists no values in:\n{help_output}"
    return [value.strip() for value in match.group(1).split(",")]


BLOCK = """
import sys

for name in {blocked!r}:
    sys.modules[name] = None  # as if not installed: its import fails, find_spec finds none
sys.argv = ["loom", *{args!r}]
from loom.cli import app
app()
"""


def run_without(blocked: set[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`loom ARGS` in a fresh interpreter where the `blocked` modules cannot be imported."""
    code = textwrap.dedent(BLOCK.format(blocked=sorted(blocked), args=list(args)))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_environ(), "COLUMNS": "1000"},
    )


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "LOOM_TOKEN"}
