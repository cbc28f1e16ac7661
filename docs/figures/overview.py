"""Draws docs/images/overview.png: Loom's three levels, their services and the papers behind
them. Run: python docs/figures/overview.py"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

LEVELS = [
    (
        "cluster",
        "loom serve cluster",
        "RL jobs and their phases on GPU pools",
        "RollMux, PlexRL",
        "#dbe9f6",
    ),
    (
        "rollout",
        "loom serve rollout",
        "trajectories and turns on inference engines",
        "Heddle, ROSE",
        "#e2f0d9",
    ),
    (
        "action",
        "loom serve actions",
        "tool and reward calls: sandboxes, GPU services, APIs",
        "ARL-Tangram",
        "#fbe5d6",
    ),
]


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=120)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.axis("off")
    for i, (level, cmd, what, papers, color) in enumerate(LEVELS):
        y = 7.0 - 3.0 * i
        ax.add_patch(
            FancyBboxPatch((0.2, y), 6.3, 2.3, boxstyle="round,pad=0.05", fc=color, ec="#555555")
        )
        ax.text(0.5, y + 1.7, f"{level} level", fontsize=13, weight="bold")
        ax.text(0.5, y + 1.1, what, fontsize=10)
        ax.text(0.5, y + 0.45, f"{cmd}    ·    {papers}", fontsize=10, family="monospace")
        if i < 2:
            ax.add_patch(
                FancyArrowPatch(
                    (3.3, y), (3.3, y - 0.7), arrowstyle="-|>", mutation_scale=14, color="#555555"
                )
            )
    ax.add_patch(
        FancyBboxPatch((7.0, 0.6), 2.8, 8.7, boxstyle="round,pad=0.05", fc="#f2f2f2", ec="#555555")
    )
    ax.text(8.4, 8.6, "every policy runs", ha="center", fontsize=11, weight="bold")
    for k, line in enumerate(
        [
            "in the simulator",
            "(deterministic,",
            "cluster scale)",
            "",
            "and for real",
            "(processes, HTTP,",
            "vLLM engines,",
            "sandboxes, Ray)",
        ]
    ):
        ax.text(8.4, 7.9 - 0.62 * k, line, ha="center", fontsize=10)
    out = Path(__file__).resolve().parents[1] / "images" / "overview.png"
    fig.savefig(out, bbox_inches="tight")
    print(out)


if __name__ == "__main__":
    main()
