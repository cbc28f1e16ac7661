"""GPU service actions: torch modules restored from host memory on demand and evicted as the
GPU manager decides (on the CPU device tier when there is no CUDA)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from action_server_client import Client

from loom.runtime.actions import GpuNodeConfig, GpuServiceConfig
from loom.runtime.actions import driver as driver_module
from loom.runtime.actions.service_models import TORCH_HINT, MlpReward

DIM = 8
# Each service holds ~0.27 MB of weights; the device holds one of them, not both.
SERVICES = [
    GpuServiceConfig(name=name, dim=DIM, hidden=256, layers=2, seed=seed, dops=(1, 2))
    for name, seed in (("reward-a", 0), ("reward-b", 1))
]
X = [[0.1 * (i + j) for j in range(DIM)] for i in range(5)]
# NOTE: scores are compared approximately: a CPU matmul's rounding may depend on where its
# tensors sit in memory, and each restore allocates them afresh.


def _scores(service: GpuServiceConfig, rows: list[list[float]]) -> list[float]:
    import torch

    module = MlpReward(service.dim, service.hidden, service.layers, service.seed).build()
    with torch.inference_mode():
        return [float(v) for v in module(torch.tensor(rows)).squeeze(-1)]


def _call(client: Client, service: str, **extra: Any) -> dict[str, Any]:
    return client.run(trajectory_id="g", service={"name": service, "input": X, **extra})


@pytest.mark.torch
def test_services_are_restored_on_demand_and_evicted_when_memory_is_short(
    make_client: Callable[..., Client],
) -> None:
    pytest.importorskip("torch")
    client = make_client(
        gpu_nodes=[GpuNodeConfig(name="gpu0", gpus=1, memory_gb=0.0004)], services=SERVICES
    )
    expected_a, expected_b = (_scores(s, X) for s in SERVICES)

    def resident() -> list[str]:
        return [r["service"] for r in client.http.get("/v1/stats").json()["resident"]]

    first = _call(client, "reward-a")
    assert first["status"] == "succeeded" and first["restored"] and first["gpus"] == [0]
    assert first["result"]["scores"] == pytest.approx(expected_a, rel=1e-5)
    assert first["overhead_s"] > 0 and resident() == ["reward-a"]

    hit = _call(client, "reward-a")
    assert not hit["restored"]
    assert hit["result"]["scores"] == pytest.approx(expected_a, rel=1e-5)

    other = _call(client, "reward-b")  # evicts reward-a: both do not fit
    assert other["restored"] and other["result"]["scores"] == pytest.approx(expected_b, rel=1e-5)
    assert resident() == ["reward-b"]

    back = _call(client, "reward-a")  # restored again from the invariant host copy
    assert back["restored"]
    assert back["result"]["scores"] == pytest.approx(expected_a, rel=1e-5)
    assert resident() == ["reward-a"]


@pytest.mark.torch
def test_a_two_gpu_chunk_splits_the_batch_over_its_replicas(
    make_client: Callable[..., Client],
) -> None:
    pytest.importorskip("torch")
    client = make_client(
        gpu_nodes=[GpuNodeConfig(name="gpu0", gpus=2, memory_gb=1.0)], services=SERVICES[:1]
    )
    v = _call(client, "reward-a", gpus=[2])
    assert v["status"] == "succeeded" and v["gpus"] == [0, 1] and v["units"] == 2
    assert v["result"]["scores"] == pytest.approx(_scores(SERVICES[0], X), rel=1e-5)
    stats = client.http.get("/v1/stats").json()
    assert stats["resident"] == [{"node": "gpu0", "service": "reward-a", "dop": 2, "start": 0}]


@pytest.mark.torch
def test_bad_service_requests_are_4xx(make_client: Callable[..., Client]) -> None:
    pytest.importorskip("torch")
    client = make_client(
        gpu_nodes=[GpuNodeConfig(name="gpu0", gpus=1, memory_gb=1.0)], services=SERVICES[:1]
    )
    bad = [
        ({"name": "reward-a", "input": [1.0, 2.0]}, "vector of 8 numbers"),
        ({"name": "reward-z", "input": X}, "unknown service 'reward-z' (known: reward-a)"),
        ({"name": "reward-a", "input": X, "gpus": 4}, "no degree"),
    ]
    for service, message in bad:
        r = client.http.post("/v1/actions", json={"trajectory_id": "g", "service": service})
        assert r.status_code == 400 and message in r.text, r.text
    assert _call(client, "reward-a")["status"] == "succeeded"


def test_without_torch_service_actions_are_rejected_and_the_rest_works(
    make_client: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_module, "torch_available", lambda: False)
    client = make_client(
        gpu_nodes=[GpuNodeConfig(name="gpu0", gpus=1, memory_gb=1.0)], services=SERVICES[:1]
    )
    r = client.http.post(
        "/v1/actions", json={"trajectory_id": "g", "service": {"name": "reward-a", "input": X}}
    )
    assert r.status_code == 400 and TORCH_HINT in r.text
    assert client.http.get("/v1/stats").json()["gpu_services_note"] == TORCH_HINT
    assert client.run(command=["true"])["status"] == "succeeded"
