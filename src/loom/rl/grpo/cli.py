"""The terminal side of `loom run grpo`: a progress bar per job, a line per step, and a table of
the summary (with `--compare`, Loom's run and the baseline's side by side)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loom.bench.results import results as results_doc
from loom.bench.results import write_results
from loom.rl.grpo.config import GRPOConfig, load_config
from loom.rl.grpo.records import PHASES, StepRecord
from loom.rl.grpo.run import BASELINE, RunResult, run_grpo

__all__ = ["configure", "main", "run_document"]


def configure(
    path: Path | None,
    *,
    steps: int | None = None,
    out: Path | None = None,
    seed: int | None = None,
    baseline: bool = False,
) -> GRPOConfig:
    """The config file (or the defaults) with the command line's overrides."""
    base = load_config(path) if path is not None else GRPOConfig()
    data = base.model_dump()
    if steps is not None:
        data["grpo"]["steps"] = steps
    if out is not None:
        data["out"] = out
    if seed is not None:
        data["seed"] = seed
    if baseline:
        data["concurrent"] = BASELINE["concurrent"]
        data["services"] |= BASELINE["services"]
    return GRPOConfig.model_validate(data)


def _run(config: GRPOConfig, label: str, console: Console) -> RunResult:
    columns = (
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bars = {
            j.name: progress.add_task(f"{label} {j.name} ({j.task.value})", total=config.grpo.steps)
            for j in config.jobs
        }

        def on_step(r: StepRecord) -> None:
            phases = " ".join(f"{p} {r.phase_s.get(p, 0.0):.2f}" for p in PHASES)
            ratio = "" if r.ratio is None else f" ratio ±{r.ratio['std']:.1e}"
            progress.console.log(
                f"{label} {r.job} step {r.step}: reward {r.reward_mean:.3f}, "
                f"{r.generated_tokens} tokens, {r.step_s:.1f} s ({phases}){ratio}, "
                f"logprob diff {r.logprob_diff_max or 0.0:.1e}, sync {r.sync_bytes} B",
                highlight=False,
            )
            progress.update(
                bars[r.job],
                advance=1,
                description=f"{label} {r.job} ({r.task}) reward {r.reward_mean:.2f}",
            )

        stats: dict[str, Any] = {}
        result = run_grpo(config, label=label, on_step=on_step, stats=stats)
    result.summary["services"] = stats
    (config.out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    return result


def _table(results: list[RunResult]) -> Table:
    table = Table(title="GRPO: mean reward, and seconds per step (means)")
    cols = ("run", "job", "task", "reward: first", "last 5", "step", *PHASES, "run wall")
    for col in cols:
        table.add_column(col, justify="left" if col in ("run", "job", "task") else "right")
    for res in results:
        s = res.summary
        for job, j in s["jobs"].items():
            table.add_row(
                s["label"], job, j["task"], f"{j['reward_first']:.3f}",
                f"{j['reward_last5']:.3f}", f"{j['step_s']:.2f}",
                *(f"{j['phase_s'][p]:.2f}" for p in PHASES), f"{s['wall_s']:.0f}",
            )  # fmt: skip
    return table


def main(
    path: Path | None,
    *,
    steps: int | None = None,
    out: Path | None = None,
    seed: int | None = None,
    baseline: bool = False,
    compare: bool = False,
    console: Console | None = None,
    json_path: Path | None = None,
) -> list[RunResult]:
    console = console or Console()
    config = configure(path, steps=steps, out=out, seed=seed, baseline=baseline)
    runs = [("baseline" if baseline else "loom", config)]
    if compare:
        root = config.out
        loom = config.model_copy(update={"out": root / "loom"})
        slow = configure(path, steps=steps, out=root / "baseline", seed=seed, baseline=True)
        runs = [("loom", loom), ("baseline", slow)]
    results = [_run(cfg, label, console) for label, cfg in runs]
    wide = Console(width=max(console.width, 132), file=console.file)  # (a pipe is 80 wide)
    wide.print(_table(results))
    for (_, cfg), res in zip(runs, results, strict=True):
        console.print(f"records, summary and plots under {cfg.out}: " + ", ".join(
            p.name for p in res.files))  # fmt: skip
    if json_path is not None:
        write_results(json_path, run_document(results, seed=config.seed))
        console.print(f"JSON at {json_path}")
    return results


def run_document(results: list[RunResult], *, seed: int) -> dict[str, Any]:
    """The runs as one stored result (`loom.bench.results`): a `step` record per job and step
    and a `job` record per job and run (its summary), each naming its run."""
    records: list[dict[str, Any]] = []
    for res in results:
        label = res.summary["label"]
        for r in res.records:
            step = {k: v for k, v in asdict(r).items() if k not in ("phase_s", "ratio")}
            phases = {f"{p}_s": r.phase_s.get(p, 0.0) for p in PHASES}
            records.append({"record": "step", "run": label, **step, "step_s": r.step_s, **phases})
        for job, j in res.summary["jobs"].items():
            flat = {k: v for k, v in j.items() if k != "phase_s"}
            phases = {f"{p}_s": v for p, v in j["phase_s"].items()}
            records.append(
                {"record": "job", "run": label, "job": job, **flat, **phases,
                 "wall_s": res.summary["wall_s"]}
            )  # fmt: skip
    return results_doc("grpo", records, seed=seed)
