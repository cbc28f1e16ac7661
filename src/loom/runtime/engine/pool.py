"""Engines started on first use and shared by a whole test session or benchmark: starting one
takes half a minute on two cores, so tests ask a pool rather than start their own."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

from loom.core.errors import ConfigError
from loom.runtime.engine.launcher import EngineConfig, EngineProcess, require_engine
from loom.runtime.engine.model import build_tiny_model

__all__ = ["EnginePool"]

log = logging.getLogger(__name__)


class EnginePool:
    """Up to `limit` engines of one configuration. `get(n)` returns the first `n`, starting
    the missing ones (in parallel) and replacing any that died; engine `i` binds its compute
    threads to the `i`-th allowed core (round robin) so that two engines do not share one."""

    def __init__(self, config: EngineConfig | None = None, *, limit: int = 3, **overrides: Any):
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        self.config = replace(config or EngineConfig(), **overrides)
        self.limit = limit
        self._engines: list[EngineProcess | None] = []
        self._cores = sorted(os.sched_getaffinity(0))

    def get(self, n: int = 1) -> list[EngineProcess]:
        if not 1 <= n <= self.limit:
            raise ConfigError(f"asked for {n} engines; this pool holds 1 to {self.limit}")
        require_engine()
        if self.config.model is None:  # once here, not once per engine thread
            build_tiny_model(self.config.model_spec, self.config.cache_dir)
        self._engines += [None] * (n - len(self._engines))
        missing = [i for i in range(n) if not self._alive(i)]
        if missing:
            log.info("starting engines %s", missing)
            with ThreadPoolExecutor(len(missing)) as pool:
                futures = {i: pool.submit(self._start, i) for i in missing}
            failed: list[BaseException] = []
            for i, future in futures.items():
                if (exc := future.exception()) is not None:
                    failed.append(exc)
                else:
                    self._engines[i] = future.result()
            if failed:  # the engines that did start stay in the pool, for close()
                raise failed[0]
        return [e for e in self._engines[:n] if e is not None]

    def _alive(self, i: int) -> bool:
        engine = self._engines[i]
        if engine is not None and not engine.alive:
            log.warning("engine %d died (exit code %s); starting another", i, engine.wait())
            engine.stop()
            self._engines[i] = None
        return self._engines[i] is not None

    def _start(self, i: int) -> EngineProcess:
        cpus = self.config.cpus
        if cpus == "auto":
            cpus = str(self._cores[i % len(self._cores)])
        return EngineProcess.start(self.config, cpus=cpus)

    def close(self) -> None:
        engines = [e for e in self._engines if e is not None]
        self._engines = []
        for engine in engines:
            engine.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
