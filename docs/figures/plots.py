"""The reproduction plots the docs show, drawn from stored results by the experiments' own plot
functions."""

from __future__ import annotations

import tempfile
from pathlib import Path

from figures.core import StoredResultError, result

# ---- plots ----------------------------------------------------------------------------------

# The reproduction plots the docs show, by the stored result they are drawn from: the PNGs
# the experiment's plot function writes, saved as docs/images/reproductions/SYSTEM_NAME.png.
IMAGES = Path(__file__).resolve().parents[1] / "images" / "reproductions"

PLOTS: dict[str, tuple[str, ...]] = {
    "heddle-quick-seed1": ("fig12_speedup.png", "fig14_speedup.png", "fig15_speedup.png"),
    "rose-quick-seed1": ("fig7_speedup.png", "fig9.png", "fig14_speedup.png"),
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


def render_plots(out: Path) -> list[Path]:
    """Draw the docs' reproduction plots from their stored results into `out`."""
    from loom.experiments.registry import SYSTEMS

    written = []
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
