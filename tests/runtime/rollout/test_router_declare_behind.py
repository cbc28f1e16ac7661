"""A batch declared while new weights load — no engine at the current version yet — is planned
over the live engines and served once one reports the version (it had no home: every turn of
it was a 500)."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Rig
from loom.rollout.policy import PlacementKind


def test_a_batch_declared_between_weight_versions_is_served(rig: Callable[..., Rig]) -> None:
    for placement in (PlacementKind.HEDDLE, PlacementKind.LEAST_LOAD):
        r = rig(2, placement=placement)
        assert r.http.put("/v1/weights", json={"version": 1, "engines": []}).status_code == 200
        batch = [{"id": f"{placement}-t{i}", "prompt_id": i % 3} for i in range(6)]
        assert r.http.post("/v1/rollouts", json={"trajectories": batch}).status_code == 201
        for eid in ("e0", "e1"):
            assert r.http.patch(f"/v1/engines/{eid}", json={"version": 1}).status_code == 200
        for b in batch:
            resp = r.gen(b["id"], 4)
            assert resp.status_code == 200, resp.text
            assert resp.json()["meta_info"]["weight_version"] == "1"
