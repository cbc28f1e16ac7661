"""An inference engine that behaves like a GPU without one: the rollout simulator's worker
model (continuous batching, chunked prefill, KV capacity with preemption, a prefix cache, the
step times of `loom.perf`'s latency model) served over vLLM's OpenAI dialect on a scaled wall
clock. `loom serve engine --emulate qwen3-14b@h100:tp2 --time-scale 0.1`."""

from loom.runtime.emulate.config import EmulatedEngineConfig, EmulationSpec
from loom.runtime.emulate.core import EmulatedEngine, Request
from loom.runtime.emulate.process import EmulatedProcess

__all__ = ["EmulatedEngine", "EmulatedEngineConfig", "EmulatedProcess", "EmulationSpec", "Request"]
