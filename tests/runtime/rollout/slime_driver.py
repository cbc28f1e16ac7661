"""slime's own functions against Loom's router over stand-in SGLang engines: run by
`test_router_slime_code.py` in a process of its own with a slime checkout first on
`sys.path`; prints what it saw as one `REPORT {json}` line.

slime runs here as it runs in a job, but for what this machine lacks, stubbed minimally:
* `sglang` (the engine slime launches): `ServerArgs` is a plain record, and
  `kill_process_tree` ends the stand-in whose pid it is given (slime kills its engine
  after deregistering it);
* `sglang_engine._compute_server_args` (SGLang's arguments from slime's, for a GPU) returns
  the stand-in's host and port, and `launch_server_process` hands over the running stand-in
  instead of starting SGLang: `SGLangEngine.init` then registers it as it registers SGLang;
* `sglang_router` (older slime reads its version to pick routes): `LOOM_SLIME_ROUTER_VERSION`;
* `pylatexenc` (imported by slime's math reward, which nothing here computes) and, where it
  is not installed, `pandas` (imported by older slime's datasets, which nothing here reads);
* the tokenizer (`GenerateState` loads one from a checkpoint): prompts are token ids;
* `ignore_eos` joins slime's sampling params for the rollouts that must run long (a
  stand-in's next token is a function of the context, EOS included).
Usage: python slime_driver.py (with LOOM_SLIME_SRC on PYTHONPATH)."""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import time
import types
from argparse import Namespace
from typing import Any

import httpx

from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig
from loom.runtime.rollout.standin import StandinProcess, continuation

STANDINS: dict[int, StandinProcess] = {}


class Warnings(logging.Handler):
    """What slime logged at WARNING and above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("slime"):
            self.seen.append(record.getMessage())


def _module(name: str, **attrs: Any) -> types.ModuleType:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            mod = types.ModuleType(sub)
            mod.__path__ = []
            mod.__spec__ = importlib.machinery.ModuleSpec(sub, None, is_package=True)
            sys.modules[sub] = mod
            if i > 1:
                setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], mod)
    for key, value in attrs.items():
        setattr(sys.modules[name], key, value)
    return sys.modules[name]


def _kill_process_tree(pid: int) -> None:
    STANDINS.pop(pid).stop()


def stub_absent() -> None:
    _module("sglang.srt.server_args", ServerArgs=lambda **kw: Namespace(**kw))
    _module("sglang.srt.utils", kill_process_tree=_kill_process_tree)
    _module("sglang_router", __version__=os.environ.get("LOOM_SLIME_ROUTER_VERSION", "0.3.2"))

    class LatexNodes2Text:
        def latex_to_text(self, text: str) -> str:
            return text

    _module("pylatexenc.latex2text", LatexNodes2Text=LatexNodes2Text)
    if importlib.util.find_spec("pandas") is None:
        _module("pandas")  # older slime's dataset module imports it; no dataset is read here


expected = continuation


def slime_args(router: str) -> Namespace:
    host, port = router.removeprefix("http://").rsplit(":", 1)
    return Namespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        rollout_external=False,
        hf_checkpoint="(none: prompts are token ids)",
        sglang_server_concurrency=64,
        rollout_num_gpus=2,
        rollout_num_gpus_per_engine=1,
        use_distributed_post=False,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=3000,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        sglang_enable_deterministic_inference=False,
        sglang_dp_size=None,
        n_samples_per_prompt=1,
        ci_test=False,
        use_rollout_routing_replay=False,
        router_policy=None,
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=False,
        custom_generate_function_path=None,
        group_rm=False,
        rollout_sample_hook_path=None,
        sglang_speculative_algorithm=None,
    )


def start_engine(sglang_engine: Any, args: Namespace, rank: int) -> tuple[Any, StandinProcess]:
    """A stand-in (it runs one turn at once: more wait in the router) brought up by slime's
    `SGLangEngine.init`, which registers it with the router."""
    standin = StandinProcess("--step-ms", "5", "--max-running", "1")
    STANDINS[standin.proc.pid] = standin
    host, port = standin.url.removeprefix("http://").rsplit(":", 1)

    def compute_server_args(*a: Any, **kw: Any) -> tuple[dict[str, Any], list[str]]:
        return {"host": a[4], "port": a[5], "node_rank": 0}, []

    sglang_engine._compute_server_args = compute_server_args
    sglang_engine.launch_server_process = lambda server_args: standin.proc
    engine = sglang_engine.SGLangEngine(args, rank=rank)
    engine.init(dist_init_addr=f"{host}:1", port=int(port), nccl_port=0, host=host)
    return engine, standin


def stats(router: str) -> dict[str, Any]:
    return httpx.get(f"{router}/v1/stats").json()


async def until(what: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := what():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def sample_view(sample: Any, prompt: list[int]) -> dict[str, Any]:
    tokens = list(sample.tokens[len(prompt) :])
    want, lps = expected(prompt, len(tokens))
    return {
        "status": sample.status.value,
        "tokens": len(tokens),
        "exact": tokens == want and list(sample.rollout_log_probs or []) == lps,
    }


async def drive(router: str, report: dict[str, Any]) -> None:
    from slime.backends.sglang_utils import sglang_engine
    from slime.rollout import sglang_rollout
    from slime.utils.http_utils import init_http_client
    from slime.utils.types import Sample

    args = slime_args(router)
    init_http_client(args)
    sglang_rollout.load_tokenizer = lambda *a, **kw: None
    sglang_rollout.load_processor = lambda *a, **kw: None
    engines = [start_engine(sglang_engine, args, rank) for rank in range(2)]
    workers = httpx.get(f"{router}/workers").json()["workers"]
    report["registered"] = [w["url"] for w in workers]
    report["engine_urls"] = [standin.url for _, standin in engines]

    # a rollout: slime's own request and its reading of the answer
    state = sglang_rollout.GenerateState(args)
    sample = Sample(prompt="(token ids)", tokens=[3, 4, 5])
    params = {**state.sampling_params, "max_new_tokens": 12}
    sample = await sglang_rollout.generate(args, sample, params)
    report["generate"] = sample_view(sample, [3, 4, 5])

    # the end-of-step abort: two turns run at the engines, two wait in the router
    state.sampling_params["ignore_eos"] = True
    groups = [[Sample(prompt="(token ids)", tokens=[7, i], index=i)] for i in range(4)]
    prompts = {i: [7, i] for i in range(4)}
    state.submit_generate_tasks(groups)

    def two_and_two() -> bool:
        s = stats(router)
        running = sum(e["running"] for e in s["engines"].values())
        waiting = sum(e["waiting"] for e in s["engines"].values()) + s["held"]
        return running == 2 and waiting == 2 and all(e["tokens"] for e in s["engines"].values())

    await until(two_and_two)
    started = time.monotonic()
    aborted = await sglang_rollout.abort(args, rollout_id=0)
    report["abort_s"] = round(time.monotonic() - started, 2)
    report["aborted"] = [sample_view(s, prompts[s.index]) for group in aborted for s in group]
    report["router_load_after_abort"] = httpx.get(f"{router}/v1/loads?include=core").json()
    report["engines_running_after_abort"] = [
        httpx.get(f"{standin.url}/debug/stats").json()["running"] for _, standin in engines
    ]
    report["stats_after_abort"] = stats(router)["policy"]
    state.reset()

    # shutdown: slime deregisters an engine that runs a turn, then kills it
    long = Sample(prompt="(token ids)", tokens=[9, 9])
    params = {**state.sampling_params, "max_new_tokens": 600}
    task = asyncio.get_running_loop().create_task(sglang_rollout.generate(args, long, params))

    def busy() -> str | None:
        for e in stats(router)["engines"].values():
            if e["running"] and e["tokens"] > 10:
                return str(e["url"])
        return None

    url = await until(busy)
    engine = next(engine for engine, standin in engines if standin.url == url)
    await asyncio.to_thread(engine.shutdown)
    long = await task
    report["moved"] = sample_view(long, [9, 9])
    after = stats(router)
    report["engines_after_shutdown"] = [e["url"] for e in after["engines"].values()]
    report["stats_after_shutdown"] = after["policy"]
    report["failed_turns"] = [e["failed_turns"] for e in after["engines"].values()]
    other = next(engine for engine, standin in engines if standin.url != url)
    await asyncio.to_thread(other.shutdown)  # idle: it goes at once
    report["workers_at_end"] = [w["id"] for w in httpx.get(f"{router}/workers").json()["workers"]]
    report["stats_at_end"] = stats(router)["policy"]


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    warnings = Warnings()
    logging.getLogger().addHandler(warnings)
    stub_absent()
    import slime

    report: dict[str, Any] = {"slime": os.path.dirname(os.path.dirname(slime.__file__))}
    with BackgroundRouter(RolloutServerConfig(port=0, health_interval_s=0.5)) as router:
        try:
            asyncio.run(drive(router.url, report))
        finally:
            for standin in list(STANDINS.values()):
                standin.stop()
    report["slime_warnings"] = warnings.seen
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
