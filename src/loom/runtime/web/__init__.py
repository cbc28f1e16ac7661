"""What every Loom service shares over the web, whichever framework serves it: one error body
and status per `LoomError` (`errors`), one token check (`auth`), one health body and metrics
exposition (`probes`), one body limit (`limits`), and thin adapters for ASGI (`asgi`: the
action server, the relay, the cluster service on FastAPI) and aiohttp (`aio`: the rollout
router and the emulated engine).

Two stacks, one layer: the router stays on aiohttp because it spends less server CPU per
request there (`benchmarks/bench_web_stack.py`, `docs/results/bench-web-stack.json`; see
`docs/services/index.md`), and its per-request CPU is the router's budget; the control-plane
services keep FastAPI for its typed schemas and OpenAPI pages."""

from loom.runtime.web.auth import refusal
from loom.runtime.web.errors import ErrorShape, Rendered, code_of, error_parts, render
from loom.runtime.web.limits import too_large
from loom.runtime.web.probes import METRICS_CONTENT_TYPE, exposition, health

__all__ = [
    "METRICS_CONTENT_TYPE",
    "ErrorShape",
    "Rendered",
    "code_of",
    "error_parts",
    "exposition",
    "health",
    "refusal",
    "render",
    "too_large",
]
