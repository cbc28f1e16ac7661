"""`loom run grpo CONFIG`: start the stack, run every job (at once, or one after the other), and
write the records (`records.jsonl`), the summary (`summary.json`) and the plots (`reward.png`,
`phases.png`) under the config's `out`."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from loom.rl.grpo.config import GRPOConfig
from loom.rl.grpo.job import JobRun
from loom.rl.grpo.pool import SharedEngines
from loom.rl.grpo.records import StepRecord, plot, summarize, write_records
from loom.rl.grpo.stack import Stack
from loom.rl.grpo.tasks import make_task

__all__ = ["BASELINE", "RunResult", "run_grpo"]

# the same run without Loom's policies: slime's router (least load, first come first served)
# and the jobs one after the other
BASELINE: dict[str, Any] = {
    "concurrent": False,
    "services": {"placement": "least_load", "scheduler": "fcfs", "cluster_policy": "fcfs"},
}


class RunResult:
    def __init__(
        self, records: list[StepRecord], summary: dict[str, Any], files: list[Path]
    ) -> None:
        self.records, self.summary, self.files = records, summary, files


def model_for(config: GRPOConfig) -> Path:
    """The model every job starts from: the configured directory, or the tiny Qwen3."""
    if config.model.dir is not None:
        return config.model.dir.expanduser().resolve()
    from loom.runtime.engine.model import TinyModelSpec, build_tiny_model

    return build_tiny_model(TinyModelSpec(init_std=config.model.init_std))


def run_grpo(
    config: GRPOConfig, *, label: str = "loom", on_step: Any = None, stats: Any = None
) -> RunResult:
    """Run the config's jobs; `on_step(record)` hears of each step as it ends, `stats` (if
    given) gets the services' own counts (the cluster's switches, the engines' loads)."""
    from transformers import AutoTokenizer

    model_dir = model_for(config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with Stack(config, model_dir) as stack:
        records = asyncio.run(_run_jobs(config, stack, model_dir, tokenizer, t0, on_step, stats))
    wall = time.perf_counter() - t0
    summary = summarize(records, wall_s=wall, label=label)
    write_records(out / "records.jsonl", records)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    files = [out / "records.jsonl", out / "summary.json"]
    files += plot(records, out, title=f"GRPO ({label})")
    return RunResult(records, summary, files)


async def _run_jobs(
    config: GRPOConfig,
    stack: Stack,
    model_dir: Path,
    tokenizer: Any,
    t0: float,
    on_step: Any,
    stats: Any,
) -> list[StepRecord]:
    assert stack.engines_ready is not None
    ready = asyncio.wrap_future(stack.engines_ready)
    engines: SharedEngines | None = None

    async def shared() -> SharedEngines:
        nonlocal engines
        refs = await ready
        if engines is None:
            engines = SharedEngines(refs, stack.router.url)
        return engines

    runs = []
    for spec in config.jobs:
        job = JobRun(
            spec=spec,
            config=config,
            task=make_task(spec.task, tokenizer, spec.seed),
            model_dir=str(model_dir),
            cluster_url=stack.cluster.url,
            router_url="",  # (known once the engines are up)
            actions_url=stack.actions.url,
            relay_url=stack.relays[spec.name].url,
            engines=None,  # type: ignore[arg-type]
            t0=t0,
            on_step=on_step or (lambda r: None),
        )
        runs.append(job)

    async def one(job: JobRun) -> list[StepRecord]:
        async def bind() -> None:
            job.engines = await shared()
            job.router_url = stack.router.url

        job.engines_ready = asyncio.ensure_future(bind())
        return await job.run()

    try:
        if config.concurrent:
            done = await asyncio.gather(*(one(j) for j in runs))
        else:
            done = [await one(j) for j in runs]
    finally:
        if not ready.done():
            ready.cancel()
    if stats is not None:
        cluster = stack.cluster.app.state.driver
        stats["cluster"] = cluster.stats()["counts"]
        stats["cluster_failures"] = [  # each failed operation or step, and why
            f"{r.kind} {r.op_id} of {r.deployment}: {r.error}"
            for r in cluster.core.ops.values()
            if r.status.value == "failed"
        ]
        stats["engine_switches"] = engines.switches if engines is not None else 0
        stats["engine_loads"] = len(engines.loads) if engines is not None else 0
        stats["job_timings"] = {j.spec.name: dict(j.timings) for j in runs}
        actions = stack.actions.app.state.driver
        finished: dict[str, int] = {}  # the action server's own count, by status
        for metric in actions.metrics.registry.collect():
            if metric.name == "loom_actions_finished":
                for sample in metric.samples:
                    if sample.name.endswith("_total"):
                        status = sample.labels["status"]
                        finished[status] = finished.get(status, 0) + int(sample.value)
        stats["sandbox_actions"] = finished
        stats["sandbox"] = actions.stats().sandbox
    return [r for recs in done for r in recs]
