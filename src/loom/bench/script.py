"""A benchmark script's `--json PATH`: the option on its parser, and its records written there
as one results document (`loom.bench.results`) that names the command, date and seed."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loom.bench.results import results, write_results

__all__ = ["add_json_option", "write_json"]


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """Add `--json PATH` (default: none, nothing written) to a script's parser."""
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the figures printed here as one JSON results document",
    )


def write_json(
    path: str | Path | None,
    benchmark: str,
    records: Iterable[Mapping[str, Any]],
    *,
    seed: int,
) -> Path | None:
    """Write `records` to `path` as `benchmark`'s results document, `seed` the one its random
    draws used (0 where it draws none); the path written, or None where `path` is None."""
    if path is None:
        return None
    return write_results(path, results(benchmark, records, seed=seed))
