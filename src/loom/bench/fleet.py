"""The engines a benchmark runs against, one kind per class behind one interface (`Fleet`):
stand-in SGLang engines, vLLM CPU engines (the `engine` extra), emulated GPU engines
(`loom serve engine --emulate`), or engines already running. A fleet is a context manager:
inside it the engines answer at `urls`; after it nothing it started is left running."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from loom.bench.process import wait_ready
from loom.bench.settings import RouterSetup

__all__ = [
    "ENGINE_COUNTERS",
    "TINY_PROFILE",
    "EmulatedEngines",
    "Fleet",
    "RunningEngines",
    "StandinEngines",
    "VllmEngines",
]

# Heddle's placement cost for the vLLM CPU engines: their measured profile
TINY_PROFILE = Path(str(resources.files("loom.perf") / "data/profiles/loom-tiny_cpu-vllm_tp1.csv"))

# an emulated engine's counters (`GET /debug/stats`), summed over the fleet: preemptions,
# tokens prefilled and found cached, GPU-busy seconds
ENGINE_COUNTERS = ("preemptions", "prefill_tokens", "cached_hit_tokens", "busy_s")


class Fleet(ABC):
    """Engines of one kind; `urls` once entered. `time_scale`: wall seconds per second of the
    hardware the engines stand for (an emulated GPU's; 1 for engines that run for real)."""

    time_scale: float = 1.0

    def __init__(self) -> None:
        self.urls: list[str] = []
        self._pids: list[int] = []
        self._stack: contextlib.ExitStack | None = None

    @abstractmethod
    def _start(self, stack: contextlib.ExitStack) -> None:
        """Start the engines, each stopped by `stack`; set `urls` (and `_pids`)."""

    def describe(self) -> str:
        return f"{len(self.urls)} engines"

    def pids(self) -> list[int]:
        """Processes whose CPU is the engines' (they and their children)."""
        return list(self._pids)

    def counters(self) -> dict[str, float]:
        """The engines' own counters, summed; none for engines that keep none."""
        return {}

    def model_name(self) -> str:
        """The model's name as the engines serve it (a peer router's requests name it)."""
        got = httpx.get(self.urls[0] + "/v1/models", timeout=30)
        got.raise_for_status()
        return str(got.json()["data"][0]["id"])

    def profiles(self) -> tuple[Path, ...]:
        """Measured latency profiles of these engines, for Heddle's placement cost and the
        simulator; none: the router plans with a roofline model."""
        return ()

    def router_setup(
        self, *, max_running: int, queue: int = 0, settings: Mapping[str, Any] | None = None
    ) -> RouterSetup:
        """How Loom's router is set over these engines."""
        return RouterSetup(
            max_running=max_running,
            queue=queue,
            profiles=self.profiles(),
            settings=dict(settings or {}),
        )

    def __enter__(self) -> Self:
        assert self._stack is None, "a fleet is entered once at a time"
        stack = contextlib.ExitStack()
        try:
            self._start(stack)
        except BaseException:
            stack.close()
            self.urls, self._pids = [], []
            raise
        self._stack = stack
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        self.urls, self._pids = [], []
        if stack is not None:
            stack.close()


class RunningEngines(Fleet):
    """Engines already running at `urls` (`--engine URL ...`): nothing is started or stopped.
    `profiles`: their measured profiles, where they are `loom serve engine`s."""

    def __init__(self, urls: Sequence[str], *, profiles: Sequence[Path] = ()) -> None:
        super().__init__()
        if not urls:
            raise ValueError("running engines need at least one URL")
        self._given = [u.rstrip("/") for u in urls]
        self._profiles = tuple(profiles)

    def _start(self, stack: contextlib.ExitStack) -> None:
        self.urls = list(self._given)

    def profiles(self) -> tuple[Path, ...]:
        return self._profiles


class StandinEngines(Fleet):
    """`n` stand-in SGLang engines (`loom.runtime.rollout.standin`), each started with
    `flags` (default: a 5 ms step)."""

    def __init__(self, n: int, *flags: str) -> None:
        super().__init__()
        if n < 1:
            raise ValueError(f"a fleet needs at least one engine, got {n}")
        self.n = n
        self.flags = flags or ("--step-ms", "5")

    def _start(self, stack: contextlib.ExitStack) -> None:
        from loom.runtime.rollout.standin import StandinProcess

        for _ in range(self.n):
            engine = stack.enter_context(StandinProcess(*self.flags))
            self.urls.append(engine.url)
            self._pids.append(engine.proc.pid)

    def describe(self) -> str:
        return f"{self.n} stand-in engines"

    def model_name(self) -> str:
        got = httpx.get(self.urls[0] + "/get_model_info", timeout=30)
        got.raise_for_status()
        return str(got.json()["model_path"])


class VllmEngines(Fleet):
    """`n` vLLM CPU engines on the tiny model (`loom.runtime.engine`, the `engine` extra),
    each taking `max_running` sequences at once, its compute threads on a core of its own
    as on separate GPUs."""

    def __init__(self, n: int, *, max_running: int) -> None:
        super().__init__()
        if n < 1:
            raise ValueError(f"a fleet needs at least one engine, got {n}")
        self.n = n
        self.max_running = max_running

    def _start(self, stack: contextlib.ExitStack) -> None:
        from loom.runtime.engine import EnginePool

        pool = stack.enter_context(EnginePool(limit=self.n, max_running=self.max_running))
        engines = pool.get(self.n)
        self.urls = [e.url for e in engines]
        self._pids = [e.pid for e in engines]

    def describe(self) -> str:
        return f"{self.n} vLLM CPU engines"

    def profiles(self) -> tuple[Path, ...]:
        return (TINY_PROFILE,)


class EmulatedEngines(Fleet):
    """`n` emulated GPU engines (`loom serve engine --emulate SPEC`): the simulator's worker
    on a wall clock scaled by `time_scale`, each running up to `max_running` sequences and
    streaming a chunk every `stream_interval_ms` wall ms; or, given a `layout` (a degree per
    engine), one engine per slot of it (`loom.runtime.rollout.layout.slots`: largest first,
    `gpus_per_node` a node), each at its degree on its node. The router takes their degrees
    and nodes and passes the scheduler's key as their priority; Heddle's placement plans with
    the GPU's roofline."""

    def __init__(
        self,
        spec: str,
        n: int,
        *,
        time_scale: float,
        max_running: int = 1024,
        stream_interval_ms: float = 250.0,
        layout: tuple[int, ...] | None = None,
        gpus_per_node: int = 8,
    ) -> None:
        from loom.runtime.emulate import EmulationSpec
        from loom.runtime.rollout.layout import slots

        super().__init__()
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.spec = EmulationSpec.parse(spec)
        self.slots = (
            [(s.tp, s.node) for s in slots(layout, sum(layout), gpus_per_node)]
            if (layout)
            else [(self.spec.tp, 0)] * n
        )
        if not self.slots:
            raise ValueError(f"a fleet needs at least one engine, got {n}")
        self.n = len(self.slots)
        self.time_scale = time_scale
        self.max_running = max_running
        self.stream_interval_ms = stream_interval_ms
        self.layout = layout

    def _start(self, stack: contextlib.ExitStack) -> None:
        from loom.runtime.emulate import EmulatedProcess

        flags = ["--time-scale", str(self.time_scale), "--max-running", str(self.max_running),
                 "--stream-interval-ms", str(self.stream_interval_ms)]  # fmt: skip
        base = f"{self.spec.model}@{self.spec.gpu.value}"
        for tp, node in self.slots:
            spec = f"{base}:tp{tp}"
            engine = stack.enter_context(EmulatedProcess(spec, *flags, "--node", str(node)))
            self.urls.append(engine.url)
            self._pids.append(engine.pid)
        for url in self.urls:
            wait_ready(url, "/health")

    def describe(self) -> str:
        what = str(self.spec)
        if self.layout:
            degrees = "+".join(str(tp) for tp, _ in self.slots)
            what = f"{self.spec.model}@{self.spec.gpu.value} in layout {degrees}"
        return f"{self.n} emulated engines {what}, time scale {self.time_scale:g}"

    def counters(self) -> dict[str, float]:
        total = dict.fromkeys(ENGINE_COUNTERS, 0.0)
        for url in self.urls:
            got = httpx.get(url + "/debug/stats", timeout=30).json()
            for k in ENGINE_COUNTERS:
                total[k] += got[k]
        return total

    def router_setup(
        self, *, max_running: int, queue: int = 0, settings: Mapping[str, Any] | None = None
    ) -> RouterSetup:
        return RouterSetup(
            max_running=max_running,
            queue=queue,
            tp=self.spec.tp,
            slots=tuple(self.slots) if self.layout else (),
            priority=True,
            model=self.spec.model,
            gpu=self.spec.gpu.value,
            settings=dict(settings or {}),
        )
