"""Performance models: sourced GPU/model specs, iteration latency, and interference curves."""

from loom.perf.interference import interference_curve, token_time
from loom.perf.latency import (
    LatencyModel,
    ProfiledLatencyModel,
    ProfileRow,
    RooflineLatencyModel,
    sample_profile,
    save_profile,
)
from loom.perf.specs import (
    Calibration,
    GpuSpec,
    ModelSpec,
    gpu_spec,
    list_gpus,
    list_models,
    load_calibration,
    model_spec,
)

__all__ = [
    "Calibration",
    "GpuSpec",
    "LatencyModel",
    "ModelSpec",
    "ProfileRow",
    "ProfiledLatencyModel",
    "RooflineLatencyModel",
    "gpu_spec",
    "interference_curve",
    "list_gpus",
    "list_models",
    "load_calibration",
    "model_spec",
    "sample_profile",
    "save_profile",
    "token_time",
]
