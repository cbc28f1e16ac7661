"""What moving a trajectory's KV between two vLLM engines saves against prefilling it again:
Loom's KV connector (`loom.runtime.engine.kv_connector`) on vLLM's CPU build, two engines on
a core each, sharing a store on tmpfs, prefill chunked at 512 tokens.

    python benchmarks/bench_vllm_kv_move.py [--models tiny,heavy] [--lengths 1000,2000,3000]
        [--repeats 5] [--json PATH]

Per model and context length, medians of `--repeats` (each repeat runs both ways, in turn):
a turn ran at engine A; its context (prompt and answer) then moves to engine B, whose next
turn (the context, a 20-token tool reply, 8 new tokens) either loads the context's blocks
that A saved (`save_s`: A's one-token save request, as the router sends it; `loaded_s`: B's
turn) or prefills everything again (`again_s`, on another context of the same length). The
move pays where `again_s` exceeds `loaded_s` by more than the part of `save_s` the tool call
does not hide.

`--json PATH` writes one results document (`loom.bench.results`): a record `"move"` per model
and length.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loom.bench.script import add_json_option, write_json

MODELS: dict[str, dict[str, Any]] = {
    "tiny": {},  # Loom's tiny Qwen3: 2 layers, hidden 128, 2 KV heads
    "heavy": {  # the tests' heavy model: hidden 1024, 16 KV heads (11 ms a decode step)
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_heads": 16,
        "num_kv_heads": 16,
    },
}
CHUNK = 512


def _turn(url: str, prompt: list[int], n: int, **extra: Any) -> tuple[dict[str, Any], float]:
    body = {
        "model": "loom-tiny",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }
    start = time.perf_counter()
    resp = httpx.post(url + "/v1/completions", json=body, timeout=600)
    seconds = time.perf_counter() - start
    resp.raise_for_status()
    return resp.json(), seconds


def _context(seed: int, n: int) -> list[int]:
    return [5 + (i * 7919 + seed * 104729) % 1000 for i in range(n)]


def bench(model: str, lengths: list[int], repeats: int, root: Path) -> list[dict[str, Any]]:
    from loom.runtime.engine import EngineConfig, EngineProcess
    from loom.runtime.engine.launcher import EngineDevice, kv_bytes_per_token
    from loom.runtime.engine.model import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(**MODELS[model])
    path = build_tiny_model(spec, root / "models")
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else root
    store = Path(tempfile.mkdtemp(prefix="loom-kv-bench-", dir=shm))
    common = {
        "model": path,
        "kv_store": store,
        "max_model_len": 4096,
        "priority": False,
        "gpu_memory_utilization": 0.15,
        "extra_args": ("--max-num-batched-tokens", str(CHUNK)),
    }
    per_token = kv_bytes_per_token(path, EngineDevice.CPU)
    rows = []
    try:
        with (
            EngineProcess.start(EngineConfig(cpus="0", **common)) as a,
            EngineProcess.start(EngineConfig(cpus="1", **common)) as b,
        ):
            for e, seed in ((a, 900), (b, 901)):  # warm both
                _turn(e.url, _context(seed, 2000), 4)
            samples: dict[int, dict[str, list[float]]] = {
                n: {"save_s": [], "loaded_s": [], "again_s": [], "saved": []} for n in lengths
            }
            seed = 0
            for _ in range(repeats):
                for n in lengths:
                    for way in ("loaded", "again"):
                        seed += 1
                        ctx = _context(seed, n)
                        out, _ = _turn(a.url, ctx, 8)
                        ctx += out["choices"][0]["token_ids"]
                        if way == "loaded":
                            saved, s = _turn(a.url, ctx, 1, kv_transfer_params={"loom_save": True})
                            samples[n]["save_s"].append(s)
                            samples[n]["saved"].append(
                                saved["kv_transfer_params"]["loom_saved_tokens"]
                            )
                        _, s = _turn(b.url, ctx + [7] * 20, 8)
                        samples[n][f"{way}_s"].append(s)
            for n in lengths:
                m = {k: statistics.median(v) for k, v in samples[n].items()}
                rows.append(
                    {
                        "record": "move",
                        "model": model,
                        "context": n,
                        "repeats": repeats,
                        "kv_bytes": int(m["saved"] * per_token),
                        "save_s": m["save_s"],
                        "loaded_s": m["loaded_s"],
                        "again_s": m["again_s"],
                        "speedup": m["again_s"] / m["loaded_s"],
                        "pays_unhidden": m["again_s"] > m["loaded_s"] + m["save_s"],
                    }
                )
    finally:
        for p in store.rglob("*"):
            if p.is_file():
                p.unlink()
        for p in sorted(store.rglob("*"), reverse=True):
            p.rmdir()
        store.rmdir()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,heavy")
    parser.add_argument("--lengths", default="1000,2000,3000")
    parser.add_argument("--repeats", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-kv-") as tmp:
        for model in args.models.split(","):
            for r in bench(model, lengths, args.repeats, Path(tmp)):
                rows.append(r)
                print(
                    f"{r['model']:>6} {r['context']:>5} tokens ({r['kv_bytes'] / 1e6:.1f} MB): "
                    f"next turn loaded {r['loaded_s']:.3f} s, prefilled again "
                    f"{r['again_s']:.3f} s ({r['speedup']:.2f}x); the save {r['save_s']:.3f} s",
                    flush=True,
                )
    if out := write_json(args.json, "bench_vllm_kv_move", rows, seed=0):
        print(f"wrote {len(rows)} records to {out}")


if __name__ == "__main__":
    main()
