"""Bytes and seconds per weight sync, as `loom run grpo` does it: a deployment of the cluster
service trains a Hugging Face model (Adam, fp32), and after each optimizer step `sync_weights`
publishes the new version to a weight relay (dense once, then sparse deltas) and has a vLLM
engine load it through Loom's worker extension, the router told the version.

    python benchmarks/bench_weight_sync.py [--sizes tiny,small] [--steps 5] [--json PATH]

Per model: its parameters, a dense copy's bytes, the median delta's bytes and changed share,
and the median seconds of publishing (rank 0: diff and push), the engine's pull (and apply),
its reload, and the whole sync as the trainer waited for it.

`--json PATH` writes one results document (`loom.bench.results`): a record `"sync"` per model
with those figures (bytes, shares and seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from loom.bench.script import add_json_option, write_json

SIZES = {
    "tiny": {},  # Loom's tiny Qwen3: 2 layers, hidden 128 (0.6 M parameters)
    "small": {
        "num_layers": 4,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_heads": 8,
        "num_kv_heads": 8,
    },
}


def bench(size: str, steps: int, root: Path) -> dict[str, Any]:
    from loom.client import ClusterClient
    from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig
    from loom.runtime.engine import EngineConfig, EngineProcess
    from loom.runtime.engine.model import TinyModelSpec, build_tiny_model
    from loom.runtime.relay.app import create_app
    from loom.runtime.relay.config import RelayConfig
    from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig
    from loom.runtime.rollout import EngineConfig as Routed
    from loom.runtime.service import BackgroundApp

    model = build_tiny_model(TinyModelSpec(init_std=0.02, **SIZES[size]), root / "models")
    relay = BackgroundApp(create_app(RelayConfig(port=0)), "127.0.0.1", 0, name="relay")
    with (
        relay,
        EngineProcess.start(EngineConfig(model=model, weight_sync=True, cpus="1")) as engine,
        BackgroundRouter(
            RolloutServerConfig(port=0, engines=(Routed(url=engine.url, id="e0"),))
        ) as router,
        BackgroundCluster(ClusterConfig(port=0, state_dir=root / size)) as cluster,
    ):
        sync = {
            "relay": {"url": relay.url, "job": size},
            "engines": [{"url": engine.url, "id": "e0"}],
            "router": router.url,
        }

        async def run() -> list[dict[str, Any]]:
            async with ClusterClient(cluster.url) as client:
                actor = await (await client.job(size)).deployment("actor", model=str(model))
                rows = [[1, 5, *range(8 + i, 24 + i)] for i in range(8)]
                out = [await actor.call("sync_weights", version=0, **sync)]
                for step in range(1, steps + 1):
                    await actor.call("forward_backward", ids=rows, loss="nll")
                    await actor.call("optim_step", lr=1e-3)
                    out.append(await actor.call("sync_weights", version=step, **sync))
                await actor.job.delete()
                return out

        syncs = asyncio.run(run())
    first, deltas = syncs[0], syncs[1:]

    def med(f: Any) -> float:
        return statistics.median(f(s) for s in deltas)

    pub = first["published"]
    return {
        "record": "sync",
        "model": size,
        "steps": steps,
        "params": pub["numel"],
        "dense_bytes": pub["dense_bytes"],
        "first_sync_bytes": pub["bytes"],
        "first_sync_s": first["sync_s"],
        "delta_bytes": med(lambda s: s["published"]["bytes"]),
        "changed_share": med(lambda s: s["published"]["changed"] / s["published"]["numel"]),
        "publish_s": med(lambda s: s["published"]["seconds"]),
        "engine_pull_s": med(lambda s: s["engines"][0]["pull_s"]),
        "engine_load_s": med(lambda s: s["engines"][0]["load_s"]),
        "engine_sync_s": med(lambda s: s["engines"][0]["seconds"]),
        "sync_s": med(lambda s: s["sync_s"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--steps", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-sync-") as tmp:
        for size in args.sizes.split(","):
            rows.append(bench(size, args.steps, Path(tmp)))
            r = rows[-1]
            print(
                f"{r['model']:>6}: {r['params'] / 1e6:.1f} M params, dense "
                f"{r['dense_bytes'] / 1e6:.2f} MB, delta {r['delta_bytes'] / 1e6:.2f} MB "
                f"({r['changed_share']:.0%} changed); per sync: publish {r['publish_s']:.3f} s, "
                f"engine pull {r['engine_pull_s']:.3f} s + reload {r['engine_load_s']:.3f} s "
                f"(engine call {r['engine_sync_s']:.3f} s), whole sync {r['sync_s']:.3f} s; "
                f"first (dense) {r['first_sync_bytes'] / 1e6:.2f} MB in {r['first_sync_s']:.3f} s",
                flush=True,
            )
    # the models' initial weights are drawn with torch's seed 0 (TinyModelSpec)
    if out := write_json(args.json, "bench_weight_sync", rows, seed=0):
        print(f"wrote {len(rows)} records to {out}")


if __name__ == "__main__":
    main()
