"""What a figure block in the docs calls: stored results (`docs/results/NAME.json`), read and
checked, and the Markdown a block writes from them (paragraphs, list items, tables, figures
formatted one way everywhere). `docs/render.py` says how the blocks work."""

from __future__ import annotations

import functools
import json
import math
import shlex
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
RESULTS = DOCS / "results"

PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
WIDTH = 96  # generated paragraphs wrap here (the pages' prose wraps at 96-100)

__all__ = [
    "Result",
    "bullet",
    "calibration",
    "cite",
    "f1",
    "f2",
    "intx",
    "para",
    "pct",
    "result",
    "secs",
    "span",
    "table",
    "x",
]


class StoredResultError(Exception):
    """A stored result is missing, malformed, or does not hold the record a page asks for."""


@dataclass(frozen=True)
class Result:
    """One stored result: the document a command wrote with `--json`."""

    name: str
    doc: dict[str, Any]

    @property
    def records(self) -> list[dict[str, Any]]:
        return list(self.doc["records"])

    @property
    def command(self) -> str:
        return str(self.doc["command"])

    @property
    def date(self) -> str:
        return str(self.doc["date"])[:10]

    @property
    def seed(self) -> Any:
        return self.doc.get("seed")

    def where(self, **match: Any) -> list[dict[str, Any]]:
        """The records whose fields equal every given value."""
        return [r for r in self.records if all(r.get(k) == v for k, v in match.items())]

    def one(self, **match: Any) -> dict[str, Any]:
        """The one record whose fields equal every given value (an error if not one)."""
        rows = self.where(**match)
        if len(rows) != 1:
            raise StoredResultError(
                f"{self.name}: {len(rows)} records match {match}, expected exactly one"
            )
        return rows[0]

    def value(self, field: str, **match: Any) -> Any:
        row = self.one(**match)
        if field not in row or row[field] is None:
            raise StoredResultError(f"{self.name}: the record {match} has no {field!r}")
        return row[field]


@functools.cache
def result(name: str) -> Result:
    """The stored result `docs/results/NAME.json`."""
    path = RESULTS / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise StoredResultError(
            f"no stored result {path.relative_to(ROOT)}: run its command with --json {path}"
        ) from None
    except json.JSONDecodeError as exc:
        raise StoredResultError(f"{path.relative_to(ROOT)} is not JSON: {exc}") from None
    missing = [k for k in ("command", "date", "records") if k not in doc]
    if missing:
        raise StoredResultError(f"{path.relative_to(ROOT)} lacks {missing}")
    return Result(name, doc)


# ---- what a block writes ------------------------------------------------------------------


_last: dict[str, Any] = {"block": None, "blank": False}


def _out(text: str) -> None:
    """One line of a block's output; a blank line right after another is dropped (a table
    then a paragraph), and none is dropped at a block's start."""
    import cog  # type: ignore[import-not-found]  # NOTE: there only while cog runs a block

    block = (cog.inFile, cog.firstLineNum)
    if _last["block"] != block:
        _last.update(block=block, blank=False)
    if text == "" and _last["blank"]:
        return
    _last["blank"] = text == ""
    cog.outl(text)


def para(text: str) -> None:
    """A paragraph, wrapped, with a blank line before and after (Markdown needs them beside
    the markers)."""
    _out("")
    _out(textwrap.fill(" ".join(text.split()), WIDTH, break_on_hyphens=False))
    _out("")


def bullet(text: str, indent: int = 0) -> None:
    """One list item, wrapped (no blank lines: items of one list follow each other)."""
    pad = " " * indent
    _out(
        textwrap.fill(
            " ".join(text.split()),
            WIDTH,
            initial_indent=pad + "- ",
            subsequent_indent=pad + "  ",
            break_on_hyphens=False,
        )
    )


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A Markdown table, with blank lines around it."""
    _out("")
    _out("| " + " | ".join(header) + " |")
    _out("|" + "---|" * len(header))
    for row in rows:
        _out("| " + " | ".join(str(c) for c in row) + " |")
    _out("")


def shown(command: str) -> str:
    """A stored command as a reader types it: without where it wrote its JSON and files."""
    words, out = shlex.split(command), []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("--json", "--out"):
            skip = True
            continue
        if w.startswith(("--json=", "--out=")):
            continue
        out.append(w)
    return shlex.join(out)


def cite(*names: str) -> str:
    """Where figures come from: each result's command and date (and seed where it has one)."""
    parts = []
    for name in names:
        r = result(name)
        seed = f"seed {r.seed}, " if r.seed is not None and "--seed" not in r.command else ""
        parts.append(f"`{shown(r.command)}` ({seed}{r.date})")
    return "; ".join(parts)


# ---- how numbers read -----------------------------------------------------------------------


def _finite(v: Any) -> float:
    if v is None or not math.isfinite(float(v)):
        raise StoredResultError(f"not a finite number: {v!r}")
    return float(v)


def x(v: Any, digits: int = 2) -> str:
    """A ratio: 1.03x."""
    return f"{_finite(v):.{digits}f}x"


def f1(v: Any) -> str:
    return f"{_finite(v):,.1f}"


def f2(v: Any) -> str:
    return f"{_finite(v):,.2f}"


def intx(v: Any) -> str:
    """A count or a rounded quantity: 1,024."""
    return f"{round(_finite(v)):,}"


def secs(v: Any, digits: int = 0) -> str:
    return f"{_finite(v):,.{digits}f} s"


def pct(v: Any, digits: int = 0) -> str:
    """A share given as a fraction: 0.27 -> 27%."""
    return f"{100 * _finite(v):.{digits}f}%"


def span(values: Iterable[Any], fmt: Callable[[Any], str] = f2, unit: str = "") -> str:
    """The range of some figures: 1.03–1.16x (one figure where they are all equal)."""
    vs = sorted(_finite(v) for v in values)
    if not vs:
        raise StoredResultError("a span of no figures")
    lo, hi = fmt(vs[0]), fmt(vs[-1])
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


# ---- headline tables ------------------------------------------------------------------------

__all__ += ["claims_table", "run_label", "wins"]


def run_label(name: str, full: str = "full scale") -> str:
    """A run's column label: its scale and seed ("`--quick`, seed 1")."""
    doc = result(name).doc
    scale = "`--quick`" if doc.get("quick") else full
    return f"{scale}, seed {doc.get('seed')}"


Claim = tuple[str, str, Callable[[Result], Any]]


def claims_table(names: Sequence[str], claims: Iterable[Claim], full: str = "full scale") -> None:
    """One row per claim: what the paper claims, its value as it states it, and Loom's figure
    in each run (the claim's function of a stored result: a string, or None where that run
    holds no such record, shown as "—")."""
    rows = []
    for claim, paper, figure in claims:
        cells = [figure(result(name)) for name in names]
        rows.append([claim, paper, *("—" if c is None else str(c) for c in cells)])
    table(["the paper's claim", "paper", *(run_label(n, full) for n in names)], rows)


def wins(values: Iterable[Any], over: float = 1.0) -> str:
    """How many of some figures exceed `over`: "4 of 6"."""
    vs = [_finite(v) for v in values]
    return f"{sum(v > over for v in vs)} of {len(vs)}"


def calibration(name: str) -> tuple[float, str]:
    """A calibrated constant of the latency model (`loom/perf/data/calibration.toml`): its
    value and the source it names, the measurement it comes from included."""
    import tomllib

    path = ROOT / "src" / "loom" / "perf" / "data" / "calibration.toml"
    entry = tomllib.loads(path.read_text())["default"][name]
    return float(entry["value"]), str(entry["source"])
