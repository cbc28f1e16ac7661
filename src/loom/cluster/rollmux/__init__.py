"""RollMux (seed 001): co-execution groups, Algorithm 1, round-robin meta-iterations."""

from loom.cluster.rollmux.admission import Admission, check_layout, worst_case_periods
from loom.cluster.rollmux.inter import RollMuxScheduler
from loom.cluster.rollmux.placements import generate_placements, isolated_layout

__all__ = [
    "Admission",
    "RollMuxScheduler",
    "check_layout",
    "generate_placements",
    "isolated_layout",
    "worst_case_periods",
]
