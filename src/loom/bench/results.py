"""A benchmark's results as one JSON document: what ran (its name, the command line, the date,
the seed, the commit and the host) and its tidy records, built, written and read back.

A record is a flat object: its parameters and metrics as plain fields with the unit in the
name (`makespan_s`, `router_cpu_ms_per_turn`), a list only of plain values
(`makespan_runs_s`). A value that is not a finite number is written as `null`.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "ResultsError",
    "command_line",
    "git_commit",
    "host",
    "provenance",
    "read_results",
    "results",
    "write_results",
]

Record = dict[str, Any]

_ENVELOPE = ("benchmark", "command", "date", "seed", "commit", "host", "records")
_SCALARS = (str, int, float, bool, type(None))


class ResultsError(ValueError):
    """A results document that is not what `results` builds: which file, and what is wrong."""


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as run, quoted for a shell: `loom …` for Loom's console script (or `python
    -m loom.cli`), else `python` and the script's arguments as given (`sys.argv`)."""
    args = list(sys.argv if argv is None else argv)
    head = Path(args[0]).name if args else ""
    if head == "loom" or Path(args[0] if args else "").parent.name == "cli":
        return shlex.join(["loom", *args[1:]])
    return shlex.join(["python", *args])


def provenance() -> dict[str, Any]:
    """What a stored result says of its making: the command line, the UTC date and time, and
    the git commit of Loom's checkout (None outside one)."""
    return {
        "command": command_line(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
    }


def git_commit(where: str | os.PathLike[str] | None = None) -> str | None:
    """The commit checked out where `where` lies (default: Loom's own source), or None where
    that is no git checkout or git is missing."""
    cwd = Path(where) if where is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def host() -> dict[str, Any]:
    """The machine a benchmark ran on."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def results(
    benchmark: str,
    records: Iterable[Mapping[str, Any]],
    *,
    seed: int,
    command: str | None = None,
    date: datetime | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    """The document of one benchmark run. `command` defaults to this process's command line,
    `date` to now and `commit` to `git_commit()`; the records are checked to be tidy."""
    when = (date or datetime.now(UTC)).astimezone(UTC)
    doc = {
        "benchmark": benchmark,
        "command": command_line() if command is None else command,
        "date": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seed": seed,
        "commit": git_commit() if commit is None else commit,
        "host": host(),
        "records": [_finite(dict(r)) for r in records],
    }
    _check(doc, "the document")
    return doc


def write_results(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> Path:
    """Write `doc` (from `results`) as strict JSON; the path written."""
    out = Path(path)
    _check(doc, str(out))
    text = json.dumps(_finite(dict(doc)), indent=1, allow_nan=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return out


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A document `write_results` wrote; ResultsError naming the file and the fault where it
    is not one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ResultsError(f"{path}: not JSON: {exc}") from None
    _check(doc, str(path))
    return doc  # type: ignore[no-any-return]


def _check(doc: Any, where: str) -> None:
    if not isinstance(doc, Mapping):
        raise ResultsError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    missing = [k for k in _ENVELOPE if k not in doc]
    if missing:
        raise ResultsError(f"{where}: missing {', '.join(missing)}")
    extra = sorted(set(doc) - set(_ENVELOPE))
    if extra:
        raise ResultsError(f"{where}: unknown field(s) {', '.join(extra)}")
    for key in ("benchmark", "command", "date"):
        if not isinstance(doc[key], str) or not doc[key]:
            raise ResultsError(f"{where}: {key} must be a non-empty string, got {doc[key]!r}")
    try:
        datetime.fromisoformat(doc["date"])
    except ValueError:
        raise ResultsError(f"{where}: date {doc['date']!r} is not ISO 8601") from None
    if not isinstance(doc["seed"], int) or isinstance(doc["seed"], bool):
        raise ResultsError(f"{where}: seed must be an integer, got {doc['seed']!r}")
    if doc["commit"] is not None and not isinstance(doc["commit"], str):
        raise ResultsError(f"{where}: commit must be a string or null, got {doc['commit']!r}")
    if not isinstance(doc["host"], Mapping):
        raise ResultsError(f"{where}: host must be an object, got {doc['host']!r}")
    if not isinstance(doc["records"], list):
        raise ResultsError(f"{where}: records must be a list, got {type(doc['records']).__name__}")
    for i, record in enumerate(doc["records"]):
        _check_record(record, f"{where}: record {i}")


def _check_record(record: Any, where: str) -> None:
    if not isinstance(record, Mapping):
        raise ResultsError(f"{where} is not an object: {record!r}")
    for key, value in record.items():
        if not isinstance(key, str):
            raise ResultsError(f"{where}: field name {key!r} is not a string")
        if isinstance(value, list | tuple):
            bad = [v for v in value if not isinstance(v, _SCALARS)]
        else:
            bad = [] if isinstance(value, _SCALARS) else [value]
        if bad:
            raise ResultsError(
                f"{where}: {key} is {bad[0]!r}; a record holds plain values and lists of them"
            )


def _finite(value: Any) -> Any:
    """NaN and the infinities as None (strict JSON has neither); tuples as lists; numbers of
    other types (numpy's) as Python's."""
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
