"""Where CUDA is: a Hugging Face model on a CUDA rank (NCCL), its logprobs matching a CPU
rank's, PPO's ratio exactly 1 on the weights that scored the rows, offload and load through
the node's sidecar (CUDA IPC) bit for bit, and a version published from CUDA tensors followed
on the host bit for bit. Skipped without a CUDA device."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from loom.runtime.cluster.wpg import WorkerGroup, WorkerGroupConfig  # noqa: E402
from loom.runtime.engine.model import TinyModelSpec, build_tiny_model  # noqa: E402
from loom.runtime.relay import InMemoryStore  # noqa: E402
from loom.runtime.relay.model_sync import WeightFollower, WeightPublisher  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

IDS = [[1, 5, 8, 9, 10, 11, 12, 13], [1, 5, 14, 15, 16, 17, 8, 9]]


def test_a_cuda_rank_trains_the_model_as_a_cpu_rank_does(tmp_path: Path) -> None:
    model = build_tiny_model(TinyModelSpec(init_std=0.02), tmp_path / "models")
    with WorkerGroup(WorkerGroupConfig(name="cpu", dp=1, model=str(model), device="cpu")) as g:
        cpu = g.run("forward", {"ids": IDS})["logprobs"]
    with WorkerGroup(WorkerGroupConfig(name="gpu", dp=1, model=str(model), device="cuda")) as g:
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
        assert any(str(pid) in apps for pid in g.pids), "the rank holds no GPU memory"
        got = g.run("forward", {"ids": IDS})["logprobs"]
        pairs = [(a, b) for r, c in zip(got, cpu, strict=True) for a, b in zip(r, c, strict=True)]
        diff = max(abs(a - b) for a, b in pairs)
        assert diff < 1e-4
        ppo = {"ids": IDS, "loss": "ppo", "old_logprobs": got, "advantages": [1.0, -1.0]}
        fb = g.run("forward_backward", ppo)
        assert fb["ratio"] == {"mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0}
        assert g.run("optim_step", {"max_grad_norm": 1.0})["grad_norm"] > 0
        digest = g.run("sync_weights")["digest"]
        assert g.run("offload", {"tier": "host"})["bytes"] > 0
        g.run("load")
        assert g.run("sync_weights")["digest"] == digest
        assert g.run("forward_backward", ppo)["ratio"]["std"] > 0  # the weights moved


def test_a_version_published_from_cuda_is_followed_bit_for_bit(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = build_tiny_model(TinyModelSpec(init_std=0.02), tmp_path / "models")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    store = InMemoryStore(1 << 30)
    pub, follower = WeightPublisher(store), WeightFollower(store, member_id="e0")
    pub.publish(0, dict(model.named_parameters()))
    follower.catch_up(0)
    with torch.no_grad():
        model.model.embed_tokens.weight[3:5] += 0.01
    published = pub.publish(1, dict(model.named_parameters()))
    assert published.streams == ("delta",) and published.changed == 2 * 128
    follower.catch_up(1)
    for name, p in model.named_parameters():
        assert torch.equal(follower.tensors[name], p.detach().cpu()), name
