"""The cluster service runs the user's model: a local Hugging Face directory (the tiny Qwen3
the engines serve) and a user's worker class `module:Class`, through every operation — the
logprobs and greedy tokens of the model itself, PPO's importance ratios, data-parallel
replicas that agree and match one rank, switches between jobs, checkpoints, TP shards — and
models it cannot run refused with a reason."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from loom.client import ClusterClient, ClusterError  # noqa: E402
from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig  # noqa: E402
from loom.runtime.engine.model import TinyModelSpec, build_tiny_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

IDS = [[5, 9, 11, 13, 2, 7], [8, 8, 9, 10, 11, 12], [1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45]]
ADV = [1.0, -1.0, 0.5, -0.25]
MASK = [[0, 0, 1, 1, 1]] * 4
ROWS = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15], [0, 31, 0, 31, 0]]

USER_MODULE = '''
import torch
from torch import nn

from loom.runtime.cluster.models import ModelWorker


class Bigram(ModelWorker):
    """The next token's logits from the last token alone: one embedding table."""

    def __init__(self, *, seed, device, vocab=32):
        gen = torch.Generator().manual_seed(seed)
        self.module = nn.Embedding(vocab, vocab)
        with torch.no_grad():
            self.module.weight.copy_(torch.randn(vocab, vocab, generator=gen))
        self.module.to(device)
        self.vocab_size = vocab

    def logits(self, ids):
        return self.module(ids)


class NotAWorker:
    pass
'''


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(TinyModelSpec(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("svc")
    (tmp / "usermodels_29.py").write_text(textwrap.dedent(USER_MODULE))
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(tmp))  # the service finds the module, its workers import it
    mp.setenv("PYTHONPATH", f"{tmp}:{':'.join(sys.path)}")
    with BackgroundCluster(ClusterConfig(port=0, state_dir=tmp / "state")) as svc:
        yield svc
    mp.undo()


def hf_reference(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def ref_logprobs(model: Any, ids: list[list[int]]) -> torch.Tensor:
    x = torch.tensor(ids)
    with torch.no_grad():
        logits = model(input_ids=x[:, :-1]).logits
    return torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None])[..., 0]


def test_a_hugging_face_directory_trains_as_the_model_itself(service, model_dir: Path) -> None:
    ref = hf_reference(model_dir)

    async def run() -> dict[str, Any]:
        async with ClusterClient(service.url) as cluster:
            job = await cluster.job("hf")
            actor = await job.deployment("actor", dp=2, model=str(model_dir), group=0)
            solo = await (await cluster.job("hf-solo")).deployment(
                "actor", dp=1, model=str(model_dir), group=0
            )  # the same model on one rank, sharing the node group (switches between them)
            got: dict[str, Any] = {}
            got["logprobs"] = (await actor.call("forward", ids=IDS))["logprobs"]
            got["tokens"] = (await actor.call("generate", ids=[r[:3] for r in IDS], max_tokens=5))[
                "tokens"
            ]
            steps = []
            for dep in (actor, solo):
                old = (await dep.call("forward", ids=IDS))["logprobs"]
                fb = await dep.call(
                    "forward_backward", ids=IDS, loss="ppo", old_logprobs=old,
                    advantages=ADV, mask=MASK, agg="token", clip=0.2,
                )  # fmt: skip
                steps.append((fb, await dep.call("optim_step", max_grad_norm=1.0)))
            got["steps"] = steps
            got["after"] = [(await d.call("forward", ids=IDS))["logprobs"] for d in (actor, solo)]
            got["sync"] = await actor.call("sync_weights", tp=2)
            got["stats"] = await cluster.stats()
            await job.delete()
            await solo.job.delete()
            return got

    got = asyncio.run(run())
    want = ref_logprobs(ref, IDS)
    assert torch.allclose(torch.tensor(got["logprobs"]), want, atol=1e-5)
    want_tokens = ref.generate(
        torch.tensor([r[:3] for r in IDS]), do_sample=False, max_new_tokens=5, min_new_tokens=5
    )[:, 3:]
    assert got["tokens"] == want_tokens.tolist()
    for fb, step in got["steps"]:
        # the weights that scored the rows sampled them: every importance ratio is 1
        assert fb["ratio"] == {"mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0}, fb
        assert fb["clipped"] == 0.0 and fb["tokens"] == 12
        assert step["step"] == 1 and step["grad_norm"] > 0
    # two ranks' summed gradients are one rank's, to rounding; and the weights moved
    two, one = (torch.tensor(x) for x in got["after"])
    assert torch.allclose(two, one, atol=1e-4) and not torch.allclose(two, want, atol=1e-3)
    assert got["sync"]["version"] == 1 and len(got["sync"]["reshard"]["shard_digests"]) == 2
    assert got["stats"]["counts"]["switches"] >= 2


def test_a_users_worker_class_learns_and_follows_its_vocabulary(service) -> None:
    async def run() -> dict[str, Any]:
        async with ClusterClient(service.url) as cluster:
            job = await cluster.job("user")
            dep = await job.deployment("actor", dp=2, model="usermodels_29:Bigram", seed=3, group=0)
            out: dict[str, Any] = {"info": (await cluster.stats())["deployments"][dep.id]}
            rows = ROWS
            out["before"] = (await dep.call("forward", ids=rows))["logprobs"]
            losses = []
            for _ in range(25):
                losses.append((await dep.call("forward_backward", ids=rows, loss="nll"))["loss"])
                await dep.call("optim_step", lr=0.1)
            out["losses"] = losses
            out["tokens"] = (await dep.call("generate", ids=[[1], [6]], max_tokens=4))["tokens"]
            with pytest.raises(ClusterError, match=r"outside the model's vocabulary \[0, 32\)"):
                await dep.call("forward", ids=[[1, 40]])
            with pytest.raises(ClusterError, match="tensor-parallel layout is unknown"):
                await dep.call("sync_weights", tp=2)
            out["sync"] = await dep.call("sync_weights")  # the replicas agree
            await job.delete()
            return out

    out = asyncio.run(run())
    assert out["info"]["model"] == "usermodels_29:Bigram"
    gen = torch.Generator().manual_seed(3)
    table = torch.log_softmax(torch.randn(32, 32, generator=gen), -1)
    rows = torch.tensor(ROWS)
    want = table[rows[:, :-1], rows[:, 1:]]
    assert torch.allclose(torch.tensor(out["before"]), want, atol=1e-6)
    assert out["losses"][-1] < 0.5 * out["losses"][0]  # it learned the rows' transitions
    assert out["tokens"] == [[2, 3, 4, 5], [7, 8, 9, 10]]
    assert out["sync"]["version"] == 25


def test_models_it_cannot_run_are_refused_with_a_reason(service, model_dir: Path) -> None:
    http = httpx.Client(base_url=service.url, timeout=300)
    cases = [
        ({"model": "usermodels_29:NotAWorker"}, 400, "is not a ModelWorker subclass"),
        ({"model": "usermodels_29:Missing"}, 400, "usermodels_29 has no Missing"),
        ({"model": "usermodels_29:Bigram", "model_options": {"width": 3}}, 400,
         "cannot build usermodels_29:Bigram with ['width']"),
        ({"model": str(model_dir / "tokenizer.json")}, 400, "nor a local model directory"),
        ({"model": str(model_dir.parent)}, 400, "the directory has no config.json"),
        ({"model": str(model_dir), "model_options": {"dtype": "int8"}}, 400, "dtype must be"),
    ]  # fmt: skip
    for i, (body, status, words) in enumerate(cases):
        resp = http.post("/v1/deployments", json={"job_id": f"bad{i}", **body})
        assert resp.status_code == status and words in resp.text, (body, resp.text)
    dep = http.post("/v1/deployments", json={"job_id": "pay", "model": str(model_dir)}).json()["id"]
    op = f"/v1/deployments/{dep}/ops"
    bad = [
        ({"ids": IDS, "loss": "ppo", "advantages": ADV}, "the ppo loss needs old_logprobs"),
        ({"ids": IDS, "loss": "pg", "clip": 0.1}, "clip is read by the ppo loss only"),
        ({"ids": IDS, "loss": "nll", "advantages": ADV}, "advantages are not read by the nll"),
        ({"ids": IDS, "loss": "kl"}, "loss: 'kl' is not one of nll, pg, ppo"),
        ({"ids": IDS, "mask": [[1, 1]] * 4}, "mask[0]: 2 values; a row has one per predicted"),
        ({"ids": IDS, "mask": [[0] * 5] * 4, "agg": "token"}, "mask scores no token"),
        ({"ids": IDS, "mask": [[2] * 5] * 4}, "mask[0][0]"),
        ({"ids": IDS, "loss": "ppo", "old_logprobs": [[0.0] * 5] * 3, "advantages": ADV},
         "old_logprobs: 3 rows for 4 rows of ids"),
        ({"ids": [[1, 2, 2000]]}, "outside the model's vocabulary [0, 1024)"),
    ]  # fmt: skip
    for payload, words in bad:
        resp = http.post(op, json={"op": "forward_backward", "payload": payload})
        assert resp.status_code == 400 and words in resp.text, (payload, resp.text)
    relay = {"url": "http://127.0.0.1:1"}
    engines = [{"url": "http://127.0.0.1:2"}]
    bad_syncs = [
        ({"engines": engines}, "engines, router and version go with a relay"),
        ({"relay": relay, "engines": engines, "router": "http://127.0.0.1:3"},
         "need their router id (id)"),
        ({"relay": relay, "router": "http://127.0.0.1:3"}, "name the engines it routes to"),
        ({"relay": {"url": "ftp://x"}}, "relay.url: String should match pattern"),
        ({"relay": relay | {"dense_every": -1}}, "relay.dense_every"),
    ]  # fmt: skip
    for payload, words in bad_syncs:
        resp = http.post(op, json={"op": "sync_weights", "payload": payload})
        assert resp.status_code == 400 and words in resp.text, (payload, resp.text)
    assert http.delete("/v1/jobs/pay").status_code == 200
    http.close()
