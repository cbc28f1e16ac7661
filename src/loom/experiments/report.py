"""Tidy result records: rich tables, one CSV and one PNG per experiment, and a JSON file.

A record is a flat dict naming its `experiment` and `policy`, its parameters as plain fields
and its metrics with the unit in the name (DESIGN.md, "Experiments are the contract").
"""

from __future__ import annotations

import csv
import io
import json
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
    "Record",
    "Task",
    "bar_plot",
    "by_experiment",
    "line_plot",
    "print_tables",
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


def write_json(path: Path, system: str, seed: int, quick: bool, records: Sequence[Record]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"system": system, "seed": seed, "quick": quick, "records": list(records)}
    path.write_text(json.dumps(doc, indent=1, default=float) + "\n")


def bar_plot(
    rows: Sequence[Record],
    *,
    x: str,
    hue: str,
    metric: str,
    path: Path,
    facet: str | None = None,
    title: str = "",
    label: Callable[[str], str] = str,
) -> Path:
    """Grouped bars: one group per value of `x`, one bar per `hue`, one panel per `facet`."""
    facets = sorted({str(r[facet]) for r in rows}) if facet else [""]
    fig, axes = plt.subplots(1, len(facets), figsize=(4.2 * len(facets), 3.4), squeeze=False)
    for ax, fv in zip(axes[0], facets, strict=True):
        sub = [r for r in rows if not facet or str(r[facet]) == fv]
        xs = list(dict.fromkeys(str(r[x]) for r in sub))
        hues = list(dict.fromkeys(str(r[hue]) for r in sub))
        width = 0.8 / max(len(hues), 1)
        for j, h in enumerate(hues):
            vals = [
                next((float(r[metric]) for r in sub if str(r[x]) == xv and str(r[hue]) == h), 0.0)
                for xv in xs
            ]
            ax.bar([i + j * width for i in range(len(xs))], vals, width, label=label(h))
        ax.set_xticks([i + width * (len(hues) - 1) / 2 for i in range(len(xs))], xs)
        ax.set_title(fv)
        ax.set_ylabel(metric)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path, title)


def line_plot(
    rows: list[Record], *, x: str, metric: str, hue: str, facet: str, path: Path, title: str
) -> Path:
    facets = list(dict.fromkeys(str(r[facet]) for r in rows))
    fig, axes = plt.subplots(1, len(facets), figsize=(4.2 * len(facets), 3.4), squeeze=False)
    for ax, fv in zip(axes[0], facets, strict=True):
        sub = [r for r in rows if str(r[facet]) == fv]
        for h in dict.fromkeys(str(r[hue]) for r in sub):
            pts = sorted((float(r[x]), float(r[metric])) for r in sub if str(r[hue]) == h)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=h)
        ax.set_title(fv)
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)  # NOTE: each workload has its own baseline
    return _save(fig, path, title)


def _save(fig: Figure, path: Path, title: str) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
