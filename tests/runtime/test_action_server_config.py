"""The action server's pieces without a server: config files, host discovery, formulation,
elasticity, the CLI entry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom.actions.managers.base import Grant
from loom.actions.policy import Start
from loom.cli import app
from loom.core.actions import ActionKind, ActionSpec
from loom.core.errors import ConfigError
from loom.core.resources import DiscreteSet, RangeSet
from loom.runtime.actions import ActionRequest, ActionServerConfig, load_config
from loom.runtime.actions.claims import Claims
from loom.runtime.actions.elasticity import Amdahl, parse_elasticity
from loom.runtime.actions.formulate import formulate
from loom.runtime.actions.host import local_cpu_node, numa_domains, parse_cpulist

EXAMPLE = Path(__file__).parents[2] / "examples" / "action_server.toml"


def test_example_config_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert [a.name for a in cfg.api] == ["search", "judge"]
    assert [s.name for s in cfg.services] == ["reward-a", "reward-b"]
    assert cfg.gpu_nodes[0].memory_gb == 0.0004


def test_json_config_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "server.json"
    path.write_text(json.dumps({"port": 9000, "api": [{"name": "x", "concurrency": 2}]}))
    cfg = load_config(path).with_overrides(port=9001, host=None)
    assert (cfg.port, cfg.host, cfg.api[0].concurrency) == (9001, "127.0.0.1", 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port = -1", "greater than or equal"),
        ("colour = 'blue'", "Extra inputs"),
        ("[[api]]\nname = 'a'\nconcurrency = 1\n[[api]]\nname = 'a'\nconcurrency = 2", "duplicate"),
        ("policy = 'fastest'", "policy"),
        ("port = ", "cannot parse"),
    ],
)
def test_bad_config_says_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "server.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_cpulist_and_numa_domains(tmp_path: Path) -> None:
    assert parse_cpulist("0-3,8, 10-11") == (0, 1, 2, 3, 8, 10, 11)
    with pytest.raises(ConfigError, match="ascending"):
        parse_cpulist("3-1")
    for node, cpus in (("node0", "0-3"), ("node1", "4-7")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    assert numa_domains([1, 2, 5, 9], tmp_path) == ((1, 2), (5,), (9,))
    assert numa_domains([0, 1], tmp_path / "missing") == ((0, 1),)


def test_local_node_uses_the_allowed_cores() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    node = local_cpu_node()
    assert sorted(c for d in node.numa for c in d) == allowed and node.memory_gb > 0
    with pytest.raises(ConfigError, match="not available"):
        local_cpu_node([max(allowed) + 1000])


def test_formulation_of_each_kind() -> None:
    cpu = ActionRequest.model_validate(
        {
            "trajectory_id": "t",
            "command": ["pytest"],
            "cpu": {"min": 1, "max": 64},
            "memory_gb": 1.5,
            "t_ori_s": 8.0,
            "elasticity": "amdahl:0.9",
        }
    )
    spec = formulate(cpu, "a1", max_cores=4)
    assert spec.kind is ActionKind.CPU_TOOL and spec.key_resource == "cpu"
    assert spec.demand == {"cpu": RangeSet(1, 4), "memory_gb": RangeSet(2, 2)}
    assert spec.elastic and spec.duration_s(4) == pytest.approx(8.0 * (0.1 + 0.9 / 4))
    gpu = ActionRequest.model_validate(
        {"trajectory_id": "t", "service": {"name": "rm", "gpus": [1, 2, 4]}}
    )
    spec = formulate(gpu, "a2", max_cores=4, t_ori_default=0.3)
    assert spec.demand == {"gpu": DiscreteSet((1, 2, 4))} and spec.service == "rm"
    assert spec.t_ori_s == 0.3 and spec.elasticity is None
    api = ActionRequest.model_validate(
        {"trajectory_id": "t", "api": {"name": "web", "url": "https://example.com/"}}
    )
    spec = formulate(api, "a3", max_cores=4)
    assert spec.demand == {"api:web": RangeSet(1, 1)} and spec.key_resource is None


def test_elasticity_forms() -> None:
    assert parse_elasticity(None, (1, 2)) is None
    assert parse_elasticity({1: 1.0, 2: 0.8}, (1, 2)) == {1: 1.0, 2: 0.8}
    assert parse_elasticity("linear", (1, 8)) is not None
    amdahl = parse_elasticity("amdahl:0.5", (1, 2))
    assert isinstance(amdahl, Amdahl) and amdahl(2) == pytest.approx(1 / 1.5)
    bad_forms = [("amdahl:2", r"\[0, 1\]"), ("amdahl:x", "a number"), ("linear:3", "no argument")]
    for bad, message in bad_forms:
        with pytest.raises(ConfigError, match=message):
            parse_elasticity(bad, (1, 2))


def test_cli_serve_actions_rejects_bad_cores() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "actions", "--cores", "100000"])
    assert result.exit_code != 0 and "not available" in result.output
    assert "--workdir" in runner.invoke(app, ["serve", "actions", "--help"]).output


def test_default_config_is_this_machine() -> None:
    cfg = ActionServerConfig()
    assert cfg.cores is None and cfg.services == () and cfg.policy.value == "tangram"


def _start(aid: str, cores: tuple[int, ...]) -> Start:
    spec = ActionSpec(
        action_id=aid,
        trajectory_id="t",
        kind=ActionKind.CPU_TOOL,
        demand={"cpu": RangeSet(len(cores), len(cores))},
        t_ori_s=1.0,
        key_resource="cpu",
    )
    grant = Grant(action_id=aid, manager="cpu", domain="local", units=len(cores), cores=cores)
    return Start(
        action=spec, units=len(cores), domain="local", grants=(grant,), overhead_s=0, expected_s=1
    )


def test_claims_refuse_busy_or_unknown_cores() -> None:
    claims = Claims([0, 1, 2, 3])
    claims.claim(_start("a", (0, 1)))
    with pytest.raises(AssertionError, match="busy"):
        claims.claim(_start("b", (1, 2)))
    with pytest.raises(AssertionError, match="do not exist"):
        claims.claim(_start("c", (7,)))
    assert claims.busy_cores == {0, 1}  # a refused claim marks nothing
    claims.release(_start("a", (0, 1)))
    claims.claim(_start("b", (1, 2)))
    assert claims.busy_cores == {1, 2}


def test_server_runs_tangram_with_arrival_lookahead() -> None:
    from loom.actions.policy import ActionPolicyKind
    from loom.actions.tangram.scheduler import ElasticScheduler
    from loom.runtime.actions.config import ActionServerConfig
    from loom.runtime.actions.driver import ActionDriver

    plain = ActionDriver(ActionServerConfig()).policy
    assert isinstance(plain, ElasticScheduler) and not plain.config.lookahead_arrivals
    on = ActionDriver(ActionServerConfig(policy=ActionPolicyKind.TANGRAM_LOOKAHEAD)).policy
    assert isinstance(on, ElasticScheduler) and on.config.lookahead_arrivals
