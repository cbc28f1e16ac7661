"""Weights follow training into a running vLLM engine: the cluster service trains the Hugging
Face directory the engine serves, `sync_weights` publishes each version to the relay (dense
first, then sparse deltas), the engine loads it through its worker extension without a
restart, and the router learns its version. After each sync the engine's greedy output for a
fixed prompt is the trainer's, its logprobs of a fixed sequence are the trainer's to fp32
precision, and the responses carry the version that produced them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from loom.client import ClusterClient  # noqa: E402
from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig  # noqa: E402
from loom.runtime.engine import (  # noqa: E402
    INSTALL_HINT,
    EngineConfig,
    EngineProcess,
    engine_available,
)
from loom.runtime.engine.model import TinyModelSpec, build_tiny_model  # noqa: E402
from loom.runtime.engine.weight_sync import EngineRef, sync_engine  # noqa: E402
from loom.runtime.relay.process import RelayProcess  # noqa: E402
from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig  # noqa: E402
from loom.runtime.rollout import EngineConfig as RoutedEngine  # noqa: E402

pytestmark = [
    pytest.mark.engine,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]

PROMPT = [5, 9, 11, 13, 2, 7]
SEQUENCE = [5, 9, 11, 13, 2, 7, 30, 31, 400, 12]
TRAIN = [[5, 9, 11, 13, 2, 7, 30, 31], [8, 8, 9, 10, 11, 12, 13, 14]]
FP32_TOL = 1e-4  # vLLM's CPU kernels against transformers', both in fp32 (measured ~1e-5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sync")
    model = build_tiny_model(TinyModelSpec(), tmp / "models")
    with (
        RelayProcess.start() as relay,
        EngineProcess.start(EngineConfig(model=model, weight_sync=True, cpus="1")) as engine,
        BackgroundRouter(
            RolloutServerConfig(port=0, engines=(RoutedEngine(url=engine.url, id="e0"),))
        ) as router,
        BackgroundCluster(ClusterConfig(port=0, state_dir=tmp / "state")) as cluster,
    ):
        yield {"model": model, "relay": relay, "engine": engine, "router": router,
               "cluster": cluster}  # fmt: skip


def routed(router: str, ids: list[int], **sampling: Any) -> dict[str, Any]:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "ignore_eos": True, **sampling},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    resp = httpx.post(f"{router}/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def engine_logprobs(router: str) -> list[float]:
    """The engine's log p of each token of SEQUENCE given the ones before (through the router)."""
    meta = routed(router, SEQUENCE, max_new_tokens=1)["meta_info"]
    return [lp for lp, _, _ in meta["input_token_logprobs"][1:]]


def test_engines_follow_training_and_agree_with_the_trainer(stack: dict[str, Any]) -> None:
    router, engine = stack["router"].url, stack["engine"]
    sync = {
        "relay": {"url": stack["relay"].url, "job": "grpo"},
        "engines": [{"url": engine.url, "id": "e0"}],
        "router": router,
    }

    async def run() -> list[dict[str, Any]]:
        seen = []
        async with ClusterClient(stack["cluster"].url) as cluster:
            actor = await (await cluster.job("grpo")).deployment(
                "actor", dp=2, model=str(stack["model"])
            )
            for step in range(3):
                if step:
                    await actor.call("forward_backward", ids=TRAIN, loss="nll")
                    await actor.call("optim_step", lr=3e-3)
                synced = await actor.call("sync_weights", **sync)
                trainer = {
                    "sync": synced,
                    "logprobs": (await actor.call("forward", ids=[SEQUENCE]))["logprobs"][0],
                    "tokens": (await actor.call("generate", ids=[PROMPT], max_tokens=8))["tokens"][
                        0
                    ],
                }
                out = routed(router, PROMPT, max_new_tokens=8)
                seen.append(
                    trainer | {
                        "engine_tokens": out["output_ids"],
                        "engine_version": out["meta_info"]["weight_version"],
                        "engine_logprobs": engine_logprobs(router),
                        "router_weights": httpx.get(f"{router}/v1/weights").json(),
                    }
                )  # fmt: skip
            await actor.job.delete()
        return seen

    seen = asyncio.run(run())
    for step, s in enumerate(seen):
        pub = s["sync"]["published"]
        assert s["sync"]["version"] == pub["version"] == step
        # the first version goes dense; then deltas, smaller than a dense copy
        assert pub["streams"] == (["dense"] if step == 0 else ["delta"])
        if step:
            assert pub["bytes"] < pub["dense_bytes"] and 0 < pub["changed"] < pub["numel"]
        (done,) = s["sync"]["engines"]
        assert done["version"] == step and done["pulled_bytes"] == pub["bytes"]
        assert s["router_weights"] == {"version": step, "current": ["e0"], "behind": []}
        assert s["engine_version"] == str(step)  # the response names the weights behind it
        assert s["engine_tokens"] == s["tokens"]  # the trainer's greedy tokens
        diff = max(abs(a - b) for a, b in zip(s["engine_logprobs"], s["logprobs"], strict=True))
        assert diff < FP32_TOL, (step, diff)
    # and training moved the weights: what the engine computes changed with them
    moved = max(abs(a - b) for a, b in zip(seen[0]["logprobs"], seen[-1]["logprobs"], strict=True))
    assert moved > 100 * FP32_TOL


def test_a_switch_loads_the_other_jobs_weights_whole(stack: dict[str, Any]) -> None:
    """One engine, two jobs' models in turn (each job's copy warm in host memory): a switch
    loads the whole of the other's, and switching back finds the first where it was."""
    from transformers import AutoModelForCausalLM

    from loom.client.relay import RelayClient
    from loom.runtime.relay.model_sync import WeightPublisher

    relay, engine, router = stack["relay"].url, stack["engine"], stack["router"].url
    model = AutoModelForCausalLM.from_pretrained(stack["model"], dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # another job's weights: far from the directory's
    with RelayProcess.start() as other_relay, RelayClient(other_relay.url) as store:
        published = WeightPublisher(store).publish(0, dict(model.named_parameters()))
        ref = EngineRef(engine.url, "e0")
        before = engine_logprobs(router)
        other = sync_engine(ref, relay=other_relay.url, job="other", version=0)
        assert other.switched and other.pulled_bytes == published.bytes
        x = torch.tensor([SEQUENCE])
        with torch.no_grad():
            want = torch.log_softmax(model(input_ids=x[:, :-1]).logits, -1)
        want_lp = want.gather(-1, x[:, 1:, None])[0, :, 0].tolist()
        got = engine_logprobs(router)
        assert max(abs(a - b) for a, b in zip(got, want_lp, strict=True)) < FP32_TOL
        back = sync_engine(ref, relay=relay, job="grpo", version=2)
        assert back.switched and back.pulled_bytes == 0  # its copy was at version 2 already
        assert max(abs(a - b) for a, b in zip(engine_logprobs(router), before, strict=True)) == 0
    rpc = httpx.post(f"{engine.url}/collective_rpc", json={"method": "loom_weights"}).json()
    assert rpc["results"] == [{"active": "grpo", "versions": {"grpo": 2, "other": 0}}]
