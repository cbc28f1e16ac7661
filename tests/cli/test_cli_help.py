"""Every command's `--help` lists every value each choice option accepts, checked against the
registries and settings models themselves: a policy registered without showing up fails here."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from cli_run import flat, invoke, listed
from pydantic import ValidationError


def _accepted(model: Callable[..., object], field: str, values: list[str]) -> list[str]:
    """The `values` that `model` takes for `field`, the other settings left at their defaults."""
    out = []
    for value in values:
        try:
            model(**{field: value})
        except ValidationError:
            continue
        out.append(value)
    return out


def placements() -> list[str]:
    from loom.rollout.policy import ROUTERS, PlacementKind
    from loom.runtime.rollout import RolloutServerConfig

    registered = [k.value for k in PlacementKind if k in ROUTERS]
    return _accepted(RolloutServerConfig, "placement", registered)


def schedulers() -> list[str]:
    from loom.rollout.policy import SCHEDULERS, SchedulerKind
    from loom.runtime.rollout import RolloutServerConfig

    registered = [k.value for k in SchedulerKind if k in SCHEDULERS]
    return _accepted(RolloutServerConfig, "scheduler", registered)


def action_policies() -> list[str]:
    from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind
    from loom.runtime.actions import ActionServerConfig

    registered = [k.value for k in ActionPolicyKind if k in ACTION_POLICIES]
    return _accepted(ActionServerConfig, "policy", registered)


def sandboxes() -> list[str]:
    from loom.runtime.actions import ActionServerConfig
    from loom.runtime.actions.config import SandboxKind

    return _accepted(ActionServerConfig, "sandbox", [k.value for k in SandboxKind])


def op_policies() -> list[str]:
    from loom.cluster.plexrl.hrrs import OP_POLICIES, OpPolicyKind
    from loom.runtime.cluster.app import ClusterConfig

    registered = [k.value for k in OpPolicyKind if k in OP_POLICIES]
    return _accepted(ClusterConfig, "policy", registered)


def launchers() -> list[str]:
    from loom.runtime.rollout.ray_deploy import EngineLauncher

    return [k.value for k in EngineLauncher]


def scheduling_policies() -> list[str]:
    from loom.rollout.engine_queue import EngineSchedulingPolicy

    return [k.value for k in EngineSchedulingPolicy]


def models() -> list[str]:
    from loom.perf.specs import list_models

    return list_models()


def gpus() -> list[str]:
    from loom.perf.specs import list_gpus

    return [str(g) for g in list_gpus()]


def engine_devices() -> list[str]:
    from loom.runtime.engine import EngineDevice

    return [d.value for d in EngineDevice]


def systems() -> list[str]:
    from loom.experiments.registry import SYSTEMS

    return SYSTEMS.names()


CHOICES = [
    (["serve", "rollout"], "--placement", placements),
    (["serve", "rollout"], "--scheduler", schedulers),
    (["serve", "rollout"], "--engine-kind", launchers),
    (["serve", "actions"], "--policy", action_policies),
    (["serve", "actions"], "--sandbox", sandboxes),
    (["serve", "cluster"], "--policy", op_policies),
    (["serve", "engine"], "--scheduling-policy", scheduling_policies),
    (["serve", "engine"], "--device", engine_devices),
    (["plan", "rollout"], "--model", models),
    (["plan", "rollout"], "--gpu", gpus),
    (["plan", "example-history"], "--model", models),
    (["reproduce"], "system", systems),
]


@pytest.mark.parametrize(("command", "option", "accepted"), CHOICES)
def test_help_lists_exactly_what_an_option_accepts(
    command: list[str], option: str, accepted: Callable[[], list[str]]
) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    values = accepted()
    assert values, f"nothing accepted for {option}?"
    assert sorted(listed(result.output, option)) == sorted(values)


def test_the_action_server_says_which_policies_run_only_in_the_simulator() -> None:
    from loom.actions.policy import ActionPolicyKind

    simulated = set(ActionPolicyKind) - set(action_policies())
    assert ActionPolicyKind.K8S in simulated  # the paper's Kubernetes baseline
    out = flat(invoke("serve", "actions", "--policy", "fastest").output)
    assert all(p.value in out for p in simulated) and "only in the simulator" in out


def test_an_engine_spec_lists_every_option_an_engine_takes() -> None:
    from loom.runtime.rollout.config import EngineConfig, parse_engine

    text = flat(invoke("serve", "rollout", "--help").output)
    options = [name for name in EngineConfig.model_fields if name not in ("url", "token")]
    for name in options:
        assert f"[,{name}" in text, f"--engine's help leaves out {name}"
    # every option listed is taken by a spec (the bare true/false ones, and the others)
    assert parse_engine("http://127.0.0.1:1,lent,priority=false,queue=2,node=1,version=3")


def test_emulate_lists_every_model_and_gpu() -> None:
    text = flat(invoke("serve", "engine", "--help").output)
    assert all(m in text for m in models()) and all(g in text for g in gpus())


@pytest.mark.parametrize(
    ("command", "option", "default"),
    [
        (["serve", "relay"], "--port", "8079"),
        (["serve", "relay"], "--max-bytes", "4G"),
        (["serve", "cluster"], "--gpus-per-group", "8"),
        (["serve", "actions"], "--policy", "tangram"),
        (["serve", "engine"], "--device", "auto"),
        (["serve", "engine"], "--stream-interval-ms", "50"),
    ],
)
def test_help_shows_the_settings_default(command: list[str], option: str, default: str) -> None:
    text = flat(invoke(*command, "--help").output)
    row = re.search(rf" {option} <.*?(?= --[a-z-]+ (?:--[a-z-]+ )?<)", text)
    assert row is not None and f"default: {default}" in row.group(0)
