"""What every Loom service shares over the web, whichever framework serves it: one error body
and status per `LoomError` (`errors`), one token check (`auth`), one health body and metrics
exposition (`probes`), one body limit (`limits`), and thin adapters for ASGI (`asgi`: the
action server, the relay, the cluster service on FastAPI) and aiohttp (`aio`: the rollout
router and the emulated engine).

The choice: one layer over two stacks, not one stack: the router stays on aiohttp, where the
same authenticated JSON route costs the server less CPU a request than on FastAPI/uvicorn
(`benchmarks/bench_web_stack.py`; the figures are in `docs/services/rollout.md`, rendered from
`docs/results/bench-web-stack.json`); the control-plane services keep FastAPI for typed schemas
and OpenAPI pages."""

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
