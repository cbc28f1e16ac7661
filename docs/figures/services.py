"""The services' figures in the docs (the relay, the weight codec, the action server, the cluster
service, the StateManager, the weight sync and the first example), each a sentence written from
a benchmark's stored result (`benchmarks/….py --json`, `loom run grpo --json`), with the command
that printed it; and Tangram's lookahead in `loom reproduce tangram`'s Fig. 9."""

from __future__ import annotations

from typing import Any

from figures.core import (
    Result,
    StoredResultError,
    cite,
    f1,
    f2,
    intx,
    para,
    pct,
    result,
    span,
    table,
)

__all__ = [
    "action_overhead",
    "action_start",
    "cluster_overhead",
    "codec_throughput",
    "cores",
    "grpo_measured",
    "kv_moves",
    "relay_throughput",
    "state_manager_cpu",
    "tangram_decision",
    "tangram_lookahead_fig9",
    "web_stack",
    "weight_sync",
]


def cores(name: str) -> str:
    """The cores of the machine a result was measured on: "2 cores"."""
    n = result(name).doc.get("host", {}).get("cpus")
    if not n:
        raise StoredResultError(f"{name}: its result does not say the machine's cores")
    return f"{n} core" if n == 1 else f"{n} cores"


def _gb(v: float) -> str:
    """Bytes as gigabytes (10^9), to one decimal."""
    return f"{v / 1e9:.1f} GB"


def _sci(v: float) -> str:
    """A small figure in scientific notation: 4e-6."""
    mantissa, exponent = f"{v:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _mb(v: float) -> str:
    """Bytes as megabytes (10^6), to two decimals."""
    return f"{v / 1e6:,.2f} MB"


# ---- the weight relay and its codec -----------------------------------------------------------


def relay_throughput(name: str) -> None:
    """The relay's push and pull rates on loopback (`bench_weight_relay.py`)."""
    r = result(name)
    push = r.one(record="phase", phase="push")
    pulls = [p for p in r.where(record="phase") if p["phase"] != "push"]
    if not pulls:
        raise StoredResultError(f"{name}: no pull phase")
    para(
        f"""On loopback, client and relay sharing {cores(name)}, a push of {_gb(push["mb"] * 1e6)}
        in {push["bucket_mib"]} MiB buckets runs at {intx(push["mb_s"])} MB/s and a pull in
        {push["batch_mib"]} MiB batches at {span((p["mb_s"] for p in pulls), intx)} MB/s, the
        median of {push["repeats"]} repeats. From {cite(name)}; `--quick` moves 256 MB."""
    )


def codec_throughput(name: str) -> None:
    """The codec's encode and apply rates over the sparse cases, numpy's and torch's kernels as
    shipped, then torch's own kernels (the CUDA path) on the CPU (`bench_weight_codec.py`)."""
    r = result(name)
    setup = r.one(record="setup")
    shipped = [
        c
        for c in r.where(record="codec")
        if c["backend"] in ("numpy", "torch") and c["changed_share"] is not None
    ]
    if not shipped:
        raise StoredResultError(f"{name}: no sparse codec records")
    target = shipped[0]["target_gb_s"]
    shares = span((c["changed_share"] for c in shipped), pct)
    text = f"""On {cores(name)}, encoding {setup["mib"]} MiB of bf16 weights runs at
        {span((c["encode_gb_s"] for c in shipped), f2)} GB/s and applying at
        {span((c["apply_gb_s"] for c in shipped), f1)} GB/s ({shares} changed; target
        {target:g} GB/s). """
    kern = [c for c in r.where(record="codec", backend="torch-kern") if c["changed_share"]]
    if kern:
        missed = [c["case"] for c in kern if not c["meets_target"]]
        verdict = (
            f"miss the target at {', '.join(missed)}" if missed else "meet the target in every case"
        )
        text += f"""Its `torch-kern` rows force torch's own kernels, the path a CUDA tensor
            takes; on the CPU they encode at {span((c["encode_gb_s"] for c in kern), f2)} GB/s
            and {verdict}, so CPU tensors use numpy's kernels on the same memory. """
    para(text + f"From {cite(name)}.")


# ---- the action server ------------------------------------------------------------------------


def action_start(name: str) -> None:
    """What bubblewrap adds to an action's start (`bench_action_server.py --start-latency`)."""
    r = result(name)
    added = r.one(record="added")
    bwrap, none = r.one(record="start", sandbox="bwrap"), r.one(record="start", sandbox="none")
    para(
        f"""What the sandbox adds to an action's start: {f1(added["median_ms"])} ms at the
        median and {f1(added["p99_ms"])} ms at the p99 (target under
        {added["target_median_ms"]:g} ms median), from grant to exit of `true`, a median
        {f1(bwrap["median_ms"])} ms under bubblewrap against {f1(none["median_ms"])} ms with
        `--sandbox none` ({added["actions"]} actions one at a time, on {cores(name)}). From
        {cite(name)}."""
    )


def action_overhead(name: str) -> None:
    """The server's overhead on 1-second actions beside ARL-Tangram's Table 1
    (`bench_action_server.py`)."""
    r = result(name)
    o = r.one(record="overhead")
    paper = r.where(record="paper")
    quoted = " and ".join(f"{pct(p['overhead_share'], 1)} for {p['workload']}" for p in paper)
    kind = "`sleep`" if o["action"] == "sleep" else "busy-loop"
    para(
        f"""On {o["action_s"]:g}-second {kind} actions, {o["cores"]} at a time on {cores(name)}
        with `--sandbox {o["sandbox"]}`, the server's overhead is
        {pct(o["server_overhead_share_median"], 1)} of execution at the median
        ({pct(o["client_overhead_share_median"], 1)} as the client sees it, with the HTTP submit
        and long-poll), {f1(o["overhead_median_ms"])} ms from grant to a running process;
        ARL-Tangram's Table 1 has {quoted}. From {cite(name)}."""
    )


# ---- the web stacks -------------------------------------------------------------------------


def web_stack(name: str) -> None:
    """Why two web stacks share one layer (`bench_web_stack.py`): the server CPU per request
    of the same authenticated JSON route on aiohttp and on FastAPI."""
    r = result(name)
    aio, api = r.one(record="stack", stack="aiohttp"), r.one(record="stack", stack="fastapi")
    a, f = aio["server_cpu_us_per_request"], api["server_cpu_us_per_request"]
    choice = "stays on aiohttp" if a < f else "could move to FastAPI"
    para(
        f"""One web layer over two stacks, not one stack: the router {choice}, because the
        same authenticated JSON route costs the server {a:.0f} µs of CPU a request there
        against {f:.0f} µs on FastAPI under uvicorn (p50 {f2(aio["p50_ms"])} ms against
        {f2(api["p50_ms"])} ms; the median of {aio["rounds"]} rounds of {aio["n"]} requests,
        on {cores(name)}). From {cite(name)}."""
    )


# ---- the cluster service and the StateManager -------------------------------------------------


def cluster_overhead(name: str) -> None:
    """What `loom serve cluster` adds to an operation (`bench_cluster_service.py`)."""
    o = result(name).one(record="op")
    para(
        f"""Submitting an operation over HTTP and awaiting it adds {f1(o["overhead_p50_ms"])} ms
        at the median to calling the worker-process group directly ({f1(o["served_p50_ms"])} ms
        against {f1(o["direct_p50_ms"])} ms; `{o["op"]}` on the tiny model, {o["n"]} times, on
        {cores(name)}; target {o["target_p50_ms"]:g} ms). From {cite(name)}."""
    )


def state_manager_cpu(name: str) -> None:
    """The in-process StateManager's moves on a machine without a GPU
    (`bench_state_manager.py`): offload to and load from each tier."""
    r = result(name)
    moves = {m["move"]: m for m in r.where(record="move")}
    first = next(iter(moves.values()), None)
    if first is None:
        raise StoredResultError(f"{name}: no move records")
    if first["device"] != "cpu":
        raise StoredResultError(f"{name}: measured on {first['device']}, not on the CPU")
    tiers = [t for t in ("host", "disk") if f"offload->{t}" in moves]
    parts = [
        f"to {t} at {f1(moves[f'offload->{t}']['gb_s'])} GB/s and back at "
        f"{f1(moves[f'load<-{t}']['gb_s'])} GB/s"
        for t in tiers
    ]
    disk = ""
    if "disk" in tiers:
        direct = "direct_io=True" in first["where"]
        disk = f"; the disk tier {'with O_DIRECT' if direct else 'buffered, with fsync'}"
    para(
        f"""Without a GPU the device tier is CPU memory and host memory is pageable: there the
        in-process manager moves a DP-{first["dp"]} deployment's {intx(first["unique_mib"])} MiB
        of unique state {", ".join(parts)} (the median of {first["repeats"]} rounds, on
        {cores(name)}{disk}). From {cite(name)}."""
    )


# ---- the weight sync and the first example ----------------------------------------------------


def weight_sync(name: str) -> None:
    """Bytes and seconds per sync through the cluster service into one engine
    (`bench_weight_sync.py`), per model."""
    rows = result(name).where(record="sync")
    if not rows:
        raise StoredResultError(f"{name}: no sync records")

    def one(s: dict[str, Any]) -> str:
        return (
            f"the {s['model']} model ({s['params'] / 1e6:.1f} M parameters) moves "
            f"{_mb(s['delta_bytes'])} in {f2(s['sync_s'])} s (publishing {f2(s['publish_s'])} s, "
            f"the engine's pull {f2(s['engine_pull_s'])} s and reload {f2(s['engine_load_s'])} s)"
        )

    shares = " and ".join(pct(s["changed_share"]) for s in rows)
    para(
        f"""Bytes and seconds per sync through the cluster service into one engine (medians of
        {rows[0]["steps"]} steps, on {cores(name)}): {"; ".join(one(s) for s in rows)}. In
        fp32, Adam changes {shares} of the weights each step (bf16 weights keep more of their bits
        from step to step; the codec carries both). From {cite(name)}."""
    )


def kv_moves(name: str) -> None:
    """The next turn after a move between two vLLM engines, its context loaded through Loom's
    KV connector against prefilled again (`bench_vllm_kv_move.py`), per model and length."""
    rows = result(name).where(record="move")
    if not rows:
        raise StoredResultError(f"{name}: no move records")
    para(
        f"""Medians of {rows[0]["repeats"]} runs on {cores(name)}, each way in turn; seconds.
        From {cite(name)}."""
    )
    table(
        [
            "model",
            "context (tokens)",
            "KV moved",
            "save",
            "next turn, loaded",
            "next turn, prefilled again",
            "speedup",
        ],
        [
            [
                r["model"],
                intx(r["context"]),
                _mb(r["kv_bytes"]),
                f2(r["save_s"]),
                f2(r["loaded_s"]),
                f2(r["again_s"]),
                f"{r['speedup']:.2f}x",
            ]
            for r in rows
        ],
    )


def _same_rewards(r: Result) -> bool:
    """Whether Loom's run and the baseline's give every job the same reward at every step."""
    steps = r.where(record="step")
    loom = {(s["job"], s["step"]): s["reward_mean"] for s in steps if s["run"] == "loom"}
    base = {(s["job"], s["step"]): s["reward_mean"] for s in steps if s["run"] == "baseline"}
    return bool(loom) and loom == base


def grpo_measured(name: str) -> None:
    """`loom run grpo --compare`: the rewards, the wall times of the two runs, and a step's
    phases in Loom's run (means over each job's steps)."""
    r = result(name)
    jobs = [r.one(record="job", run="loom", job=j) for j in ("a", "b")]
    base = r.one(record="job", run="baseline", job="a")
    a, b = jobs
    same = (
        "with the same rewards step for step (sampling is seeded, training deterministic)"
        if _same_rewards(r)
        else "their rewards differing at some steps"
    )

    def phase(p: str) -> str:
        return span((j[f"{p}_s"] for j in jobs), f2) + " s"

    para(
        f"""Measured on {cores(name)}, {a["steps"]} steps: the mean reward rises from
        {a["reward_first"]:.2f} and {b["reward_first"]:.2f}
        at the first step to {a["reward_last5"]:.2f} and {b["reward_last5"]:.2f} over the last
        five (job a, job b; chance is 0.10). Both jobs finish in {a["wall_s"]:.0f} s; one after
        the other they take {base["wall_s"]:.0f} s, {same}. A step (Loom's way, means):
        {phase("rollout")} rollout, {phase("reward")} reward, {phase("train")} training,
        {phase("switch")} switching (the node group's offload and load and the engine's reload
        of the other job's weights), {phase("sync")} sync, {phase("wait")} waiting for the
        engine; the engines' and the trainer's logprobs of every sample agree within
        {_sci(max(j["logprob_diff_max"] for j in jobs))}. Each sync moves
        {span((j["sync_bytes"] / 1e6 for j in jobs), f2, " MB")} (a dense copy:
        {_mb(a["sync_dense_bytes"])}). From {cite(name)}."""
    )


# ---- Tangram's scheduler ----------------------------------------------------------------------


def tangram_decision(name: str) -> None:
    """A decision's median time, Tangram's and its lookahead's (`bench_tangram_scheduler.py`)."""
    r = result(name)
    t = r.one(record="decision", policy="tangram", queued_behind=0)
    look = r.one(record="decision", policy="tangram_lookahead", queued_behind=0)
    para(
        f"""A decision over {look["candidates"]} candidates after {look["history"]} recent
        starts takes a median {f1(look["decision_ms"])} ms, against Tangram's
        {f1(t["decision_ms"])} ms, on {cores(name)}. From {cite(name)}."""
    )


def tangram_lookahead_fig9(name: str) -> None:
    """`tangram_lookahead` beside Tangram and fixed DoP in a `loom reproduce tangram` run's
    Fig. 9: the largest batch on each cluster, then where it trails Tangram."""
    r = result(name)
    cells = sorted({(c["cpu_cores"], c["batch_size"]) for c in r.where(experiment="fig9")})
    if not cells:
        raise StoredResultError(f"{name}: no fig9 records")

    def act(policy: str, c: int, b: int) -> float:
        return float(
            r.one(experiment="fig9", policy=policy, cpu_cores=c, batch_size=b)["avg_act_s"]
        )

    parts = []
    for c in sorted({c for c, _ in cells}):
        b = max(batch for cc, batch in cells if cc == c)
        parts.append(
            f"on {c:,} cores at batch {b:,} its ACT is {f1(act('tangram_lookahead', c, b))} s "
            f"against Tangram's {f1(act('tangram', c, b))} s (DoP 4: {f1(act('dop4', c, b))} s, "
            f"DoP 16: {f1(act('dop16', c, b))} s)"
        )
    trails = [(c, b) for c, b in cells if act("tangram_lookahead", c, b) > act("tangram", c, b)]
    if trails:
        where = "; ".join(
            f"{f1(act('tangram_lookahead', c, b))} s against {f1(act('tangram', c, b))} s at "
            f"batch {b:,} on {c:,} cores"
            for c, b in trails
        )
        tail = f" It trails Tangram in {len(trails)} of {len(cells)} cells ({where})."
    else:
        tail = f" It leads Tangram in all {len(cells)} cells."
    para(f"In `fig9`, {'; '.join(parts)}.{tail} From {cite(name)}.")
