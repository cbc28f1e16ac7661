"""Fit the serving load of ROSE's lent slice: the mean requests/s at which the slice serving
alone meets Table 1's TTFT P99 without rollouts (314.8 ms for Qwen2.5-7B, 716.1 ms for
Qwen2.5-32B). Prints the rate per lent GPU that `src/loom/sim/workloads/data/rose.toml` keeps.

    python benchmarks/calibrate_rose_serving.py
"""

from __future__ import annotations

import numpy as np

from loom.experiments.rose import (
    SERVING_ALONE_TTFT_P99_S,
    _wl,
    fit_serving_rate,
    serving_alone_ttft,
)
from loom.sim.workloads.serving import synthetic_day


def main() -> None:
    for key in ("8b", "32b"):
        wl = _wl(key)
        gpus = wl.max_lent_gpus
        rps = fit_serving_rate(key, gpus)
        day = synthetic_day(mean_rps=wl.serving_rps_per_gpu * gpus, hours=24.0, seed=0)
        stored = float(np.percentile(serving_alone_ttft(wl, gpus, day), 99))
        print(
            f"{key}: {gpus} lent GPUs, fitted {rps:.2f} req/s = {rps / gpus:.4f} per GPU; "
            f"rose.toml holds {wl.serving_rps_per_gpu:.4f}, whose TTFT P99 alone is "
            f"{stored * 1e3:.1f} ms (target {SERVING_ALONE_TTFT_P99_S[wl.serving_model] * 1e3:.1f})"
        )


if __name__ == "__main__":
    main()
