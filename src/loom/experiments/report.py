"""Tidy result records: rich tables, one CSV and one PNG per experiment, and a JSON file.

A record is a flat dict naming its `experiment` and `policy`, its parameters as plain fields
and its metrics with the unit in the name (DESIGN.md, "Experiments are the contract").
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # NOTE: headless; never opens a window
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PAPER_STYLE",
    "Record",
    "Task",
    "bar_figure",
    "bar_plot",
    "by_experiment",
    "line_figure",
    "line_plot",
    "print_tables",
    "records_doc",
    "records_json",
    "save_figure",
    "write_csvs",
    "write_json",
]

Record = dict[str, Any]
# One unit of work of a reproduction: a progress label (its experiment first) and a thunk.
Task = tuple[str, Callable[[], list[Record]]]


def by_experiment(records: Iterable[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(str(r["experiment"]), []).append(r)
    return out


def _columns(rows: Sequence[Record]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_tables(records: Sequence[Record], console: Console, title: str = "") -> None:
    """One table per experiment. On a terminal wide enough, a table whose cells and headers
    wrap rather than lose characters; elsewhere (a pipe, a file, CI's log, a terminal too
    narrow for the columns) tidy CSV with every value whole, a `# title` line before each."""
    for exp, rows in by_experiment(records).items():
        cols = [c for c in _columns(rows) if c not in ("experiment", "system")]
        name = f"{title} {exp}".strip()
        widths = [min(8, max(len(_fmt(r.get(c, ""))) for r in rows)) for c in cols]
        if not console.is_terminal or sum(w + 3 for w in widths) + 1 > console.width:
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(cols)
            writer.writerows([_fmt(r.get(c, "")) for c in cols] for r in rows)
            console.file.write(f"# {name}\n{buf.getvalue()}\n")
            continue
        table = Table(title=name, show_lines=False)
        for c, w in zip(cols, widths, strict=True):
            right = isinstance(rows[0].get(c), float)
            # NOTE: fold, never ellipsis: a cut value is a wrong value; "_" lets a header break
            table.add_column(
                c.replace("_", "_\u200b"),
                justify="right" if right else "left",
                overflow="fold",
                min_width=w,
            )
        for r in rows:
            table.add_row(*(_fmt(r.get(c, "")) for c in cols))
        console.print(table)


def write_csvs(records: Sequence[Record], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for exp, rows in by_experiment(records).items():
        path = out_dir / f"{exp}.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=_columns(rows))
            w.writeheader()
            w.writerows(rows)
        paths.append(path)
    return paths


def records_doc(system: str, seed: int, quick: bool, records: Sequence[Record]) -> dict[str, Any]:
    """The JSON document of a reproduction (DESIGN.md, "Experiments are the contract"), with
    the command that wrote it, when, and at which commit (what the docs cite beside a figure)."""
    from loom.bench.results import provenance

    return {
        "system": system,
        "seed": seed,
        "quick": quick,
        **provenance(),
        "records": list(records),
    }


def records_json(
    system: str, seed: int, quick: bool, records: Sequence[Record], indent: int | None = None
) -> str:
    """`records_doc` as strict JSON: a value that is not a finite number (a ratio over an
    empty run, a metric a row lacks) is `null`, not the `NaN` strict parsers reject."""
    doc = _finite(records_doc(system, seed, quick, records))
    return json.dumps(doc, indent=indent, allow_nan=False, default=lambda o: _finite(float(o)))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, system: str, seed: int, quick: bool, records: Sequence[Record]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(records_json(system, seed, quick, records, indent=1) + "\n")


PAPER_STYLE = {"color": "black", "zorder": 5}
"""How the paper's values are drawn: black, above Loom's bars and lines."""


def _paper_value(r: Record, paper: str | None) -> tuple[float, float] | None:
    """The paper's value of a record as (low, high): a stated figure (low == high) or a stated
    range (a pair); None where the paper gives none (absent, None, NaN)."""
    if paper is None:
        return None
    v = r.get(paper)
    if v is None or v == "":
        return None
    lo, hi = (float(v[0]), float(v[1])) if isinstance(v, (tuple, list)) else (float(v), float(v))
    return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def bar_figure(
    rows: Sequence[Record],
    *,
    x: str,
    hue: str,
    metric: str,
    ylabel: str,
    xlabel: str | None = None,
    paper: str | None = None,
    facet: str | None = None,
    title: str = "",
    label: Callable[[str], str] = str,
    logy: bool = False,
) -> Figure:
    """Grouped bars: one group per value of `x`, one bar per `hue`, one panel per `facet`.
    `ylabel` names the metric with its unit. Where a record carries the paper's value under
    `paper`, a black diamond sits on that bar at the paper's height ("paper"); where it
    carries a stated range (a pair), a black bracket spans it ("paper (range)"). `logy` for
    values that span orders of magnitude."""
    facets = sorted({str(r[facet]) for r in rows}) if facet else [""]
    groups = max(len({str(r[x]) for r in rows if not facet or str(r[facet]) == f}) for f in facets)
    width_in = max(4.2, 0.75 * groups)
    fig, axes = plt.subplots(1, len(facets), figsize=(width_in * len(facets), 3.4), squeeze=False)
    for ax, fv in zip(axes[0], facets, strict=True):
        # (a row without the metric, such as serving alone in a rollout table, has no bar)
        sub = [r for r in rows if (not facet or str(r[facet]) == fv) and r.get(metric) is not None]
        xs = list(dict.fromkeys(str(r[x]) for r in sub))
        hues = list(dict.fromkeys(str(r[hue]) for r in sub))
        width = 0.8 / max(len(hues), 1)
        points: list[tuple[float, float]] = []
        ranges: list[tuple[float, float, float]] = []
        for j, h in enumerate(hues):
            cell = {str(r[x]): r for r in sub if str(r[hue]) == h}
            pos = [i + j * width for i in range(len(xs))]
            vals = [float(cell[xv][metric]) if xv in cell else 0.0 for xv in xs]
            ax.bar(pos, vals, width, label=label(h))
            for p, xv in zip(pos, xs, strict=True):
                pv = _paper_value(cell[xv], paper) if xv in cell else None
                if pv is not None and pv[0] == pv[1]:
                    points.append((p, pv[0]))
                elif pv is not None:
                    ranges.append((p, pv[0], pv[1]))
        if points:
            ax.scatter(
                [m[0] for m in points],
                [m[1] for m in points],
                marker="D",
                s=22,
                label="paper",
                **PAPER_STYLE,
            )
        if ranges:
            mid = [(lo + hi) / 2 for _, lo, hi in ranges]
            ax.errorbar(
                [m[0] for m in ranges],
                mid,
                yerr=[
                    [m - lo for m, (_, lo, _) in zip(mid, ranges, strict=True)],
                    [hi - m for m, (_, _, hi) in zip(mid, ranges, strict=True)],
                ],
                fmt="none",
                capsize=3,
                label="paper (range)",
                ecolor="black",
                zorder=5,
            )
        ticks = [i + width * (len(hues) - 1) / 2 for i in range(len(xs))]
        long = max(map(len, xs), default=0) > 8
        ax.set_xticks(ticks, xs, rotation=30 if long else 0, ha="right" if long else "center")
        ax.set_title(fv)
        ax.set_xlabel(xlabel if xlabel is not None else x.replace("_", " "))
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
    for ax in axes[0]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            break
    fig.suptitle(title)
    return fig


def bar_plot(rows: Sequence[Record], *, path: Path, **kw: Any) -> Path:
    """`bar_figure` saved as a PNG at `path`."""
    return save_figure(bar_figure(rows, **kw), path)


def line_figure(
    rows: Sequence[Record],
    *,
    x: str,
    metric: str,
    hue: str,
    facet: str,
    xlabel: str,
    ylabel: str,
    paper: str | None = None,
    title: str = "",
) -> Figure:
    """One line per `hue` over `x`, one panel per `facet`; both axes labelled with units.
    Where records carry the paper's value under `paper`, a dashed black line with "x"
    markers of the same series, labelled "<hue> (paper)", runs beside Loom's."""
    facets = list(dict.fromkeys(str(r[facet]) for r in rows))
    fig, axes = plt.subplots(1, len(facets), figsize=(4.2 * len(facets), 3.4), squeeze=False)
    for ax, fv in zip(axes[0], facets, strict=True):
        sub = [r for r in rows if str(r[facet]) == fv and r.get(metric) is not None]
        for h in dict.fromkeys(str(r[hue]) for r in sub):
            mine = sorted((r for r in sub if str(r[hue]) == h), key=lambda r: float(r[x]))
            (line,) = ax.plot(
                [float(r[x]) for r in mine], [float(r[metric]) for r in mine], marker=".", label=h
            )
            pts = [(float(r[x]), _paper_value(r, paper)) for r in mine]
            known = [(px, pv[0]) for px, pv in pts if pv is not None]
            if known:
                ax.plot(
                    [p[0] for p in known],
                    [p[1] for p in known],
                    linestyle="--",
                    marker="x",
                    markeredgecolor=line.get_color(),
                    label=f"{h} (paper)",
                    **PAPER_STYLE,
                )
        ax.set_title(fv)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)  # NOTE: each workload has its own baseline
    fig.suptitle(title)
    return fig


def line_plot(rows: Sequence[Record], *, path: Path, **kw: Any) -> Path:
    """`line_figure` saved as a PNG at `path`."""
    return save_figure(line_figure(rows, **kw), path)


def save_figure(fig: Figure, path: Path) -> Path:
    """Write `fig` as a PNG (110 dpi) at `path` and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
