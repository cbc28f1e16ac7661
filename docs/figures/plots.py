"""The reproduction plots the docs show, drawn from stored results by the experiments' own plot
functions."""

from __future__ import annotations

import tempfile
from pathlib import Path

from figures.core import StoredResultError, result
from figures.served import heddle_served_rows

# ---- plots ----------------------------------------------------------------------------------

# The reproduction plots the docs show, by the stored result they are drawn from: the PNGs
# the experiment's plot function writes, saved as docs/images/reproductions/SYSTEM_NAME.png.
IMAGES = Path(__file__).resolve().parents[1] / "images" / "reproductions"

PLOTS: dict[str, tuple[str, ...]] = {
    "heddle-quick-seed1": ("fig12_speedup.png", "fig14_speedup.png", "fig15_speedup.png"),
    "rose-quick-seed1": (
        "fig7_speedup.png",
        "fig9.png",
        "fig14_speedup.png",
        "fig14_timeline.png",
    ),
    "tangram-quick-seed1": (
        "headlines.png",
        "fig9.png",
        "table1_exec_s.png",
        "table1_queue_s.png",
    ),
    "rollmux-quick-seed1": (
        "fig10_gain.png",
        "table4.png",
        "fig15_cost_vs_opt.png",
        "fig15_slo_attainment.png",
    ),
    "plexrl-quick-seed1": ("table2.png", "fig7b_saving.png", "fig7c.png", "fig8_drain.png"),
}


# The served benchmark's plot, drawn here from its stored result (no experiment owns it).
SERVED_PLOT = ("bench-emulated-2x8", "heddle_served.png")


def _served_plot(out: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer

    from loom.experiments.report import bar_figure, save_figure

    name, png = SERVED_PLOT
    doc = result(name)
    runs = max(r["runs"] for r in doc.where(record="system"))
    fig = bar_figure(
        heddle_served_rows(name),
        x="workload",
        hue="system",
        metric="speedup",
        paper="paper",
        xlabel="workload",
        ylabel="Heddle's speedup over it (×)",
        title=f"Heddle served on 16 emulated H100s (2×TP8), median of {runs} run(s)",
    )
    fig.set_size_inches(11, 4)
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    for i, container in enumerate(bars):  # more systems than the default cycle's ten colours
        for patch in container:
            patch.set_facecolor(plt.get_cmap("tab20")(i % 20))
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")  # above: Heddle is faster
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return save_figure(fig, out / png)


def render_plots(out: Path) -> list[Path]:
    """Draw the docs' plots from their stored results into `out`: the reproductions' and the
    served benchmark's."""
    from loom.experiments.registry import SYSTEMS

    written = [_served_plot(out)]
    for res, pngs in PLOTS.items():
        doc = result(res).doc
        system = doc["system"]
        with tempfile.TemporaryDirectory() as tmp:
            SYSTEMS.get(system).plot(doc["records"], Path(tmp))
            for png in pngs:
                src = Path(tmp) / png
                if not src.exists():
                    raise StoredResultError(f"{res}: the experiment drew no {png}")
                dst = out / f"{system}_{png}"
                out.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
                written.append(dst)
    return written
