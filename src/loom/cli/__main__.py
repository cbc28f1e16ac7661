"""`python -m loom.cli ...`: the `loom` command."""

from loom.cli import app

app()
