"""The rollout runtime: `loom serve rollout`, a trajectory-aware router in front of real
inference engines (vLLM, SGLang), driving the rollout policies of `loom.rollout` for real."""

from loom.runtime.rollout.config import (
    EngineConfig,
    EngineKind,
    RolloutServerConfig,
    load_config,
)
from loom.runtime.rollout.driver import RolloutDriver
from loom.runtime.rollout.server import BackgroundRouter, serve

__all__ = [
    "BackgroundRouter",
    "EngineConfig",
    "EngineKind",
    "RolloutDriver",
    "RolloutServerConfig",
    "load_config",
    "serve",
]
