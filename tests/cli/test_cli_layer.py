"""Flags over a config file, the same way for every service: the file's value stays where no flag
is given (a flag left at its default included), the flag wins where it is given (even when it
gives the model's own default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_run import invoke


class Started(Exception):
    """Stands in for a service's serve(): the settings it would have served with."""

    def __init__(self, settings: Any) -> None:
        super().__init__("started")
        self.settings = settings


def _capture(*args: Any, **kwargs: Any) -> None:
    raise Started(args[0])


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`loom serve ...` with every service's serve() replaced: the settings it got."""
    from loom.runtime import actions, rollout
    from loom.runtime.cluster import app as cluster
    from loom.runtime.emulate import server as emulated
    from loom.runtime.engine import EngineProcess
    from loom.runtime.relay import server as relay

    for module in (actions, rollout, cluster, relay, emulated):
        monkeypatch.setattr(module, "serve", _capture)
    monkeypatch.setattr(EngineProcess, "start", staticmethod(_capture))
    monkeypatch.setattr("loom.core.extras.require", lambda *a: None)  # vLLM, torch: not run

    def serve(*args: str) -> Any:
        result = invoke(*args)
        assert isinstance(result.exception, Started), result.output
        return result.exception.settings

    return serve


# per service: its command, a file's two settings, a flag for the second, and what each means
SERVICES = {
    "actions": (
        ["serve", "actions", "--sandbox", "none"],
        {"retain_max": 7, "policy": "dop4"},
        ["--policy", "tangram"],  # the model's default: given, so it wins
        lambda s: (s.retain_max, s.policy.value),
        (7, "tangram"),
    ),
    "relay": (
        ["serve", "relay"],
        {"member_ttl_s": 9.0, "max_bytes": 1 << 20},
        ["--max-bytes", "2M"],
        lambda s: (s.member_ttl_s, s.max_bytes),
        (9.0, 2 << 20),
    ),
    "cluster": (
        ["serve", "cluster"],
        {"groups": 3, "policy": "fcfs"},
        ["--policy", "hrrs"],
        lambda s: (s.groups, s.policy.value),
        (3, "hrrs"),
    ),
    "rollout": (
        ["serve", "rollout"],
        {"placement": "least_load", "scheduler": "sjf"},
        ["--scheduler", "fcfs"],
        lambda s: (s.placement.value, s.scheduler.value),
        ("least_load", "fcfs"),
    ),
    "engine": (
        ["serve", "engine"],
        {"port": 8123, "max_running": 5},
        ["--max-running", "7"],
        # --port's typer default (0) is no flag given: the file's port stays
        lambda s: (s.port, s.max_running),
        (8123, 7),
    ),
}


def _toml(settings: dict[str, Any]) -> str:
    return "".join(
        f"{k} = {v!r}\n".replace("'", '"') if isinstance(v, str) else f"{k} = {v}\n"
        for k, v in settings.items()
    )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_the_files_value_stays_where_no_flag_is_given(
    served: Any, name: str, tmp_path: Path
) -> None:
    command, settings, _, read, _ = SERVICES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(_toml(settings))
    assert read(served(*command, "--config", str(path))) == tuple(settings.values())


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_flag_given_wins_over_the_file(served: Any, name: str, tmp_path: Path) -> None:
    command, settings, flag, read, expected = SERVICES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(_toml(settings))
    assert read(served(*command, "--config", str(path), *flag)) == expected


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_the_access_flags_are_laid_the_same_way(served: Any, name: str, tmp_path: Path) -> None:
    command = SERVICES[name][0]
    path = tmp_path / f"{name}.toml"
    path.write_text('host = "0.0.0.0"\nallow_open = true\n')
    settings = served(*command, "--config", str(path))
    assert (settings.host, settings.allow_open, settings.token) == ("0.0.0.0", True, None)
    token = "a-token-of-sixteen-chars"
    settings = served(*command, "--config", str(path), "--host", "127.0.0.1", "--token", token)
    assert (settings.host, settings.allow_open, settings.token) == ("127.0.0.1", True, token)


def test_closed_health_sets_open_health(served: Any, tmp_path: Path) -> None:
    assert served("serve", "relay").open_health is True
    assert served("serve", "relay", "--closed-health").open_health is False


def test_the_emulated_engine_takes_only_the_flags_given(served: Any) -> None:
    from loom.runtime.emulate.config import EmulatedEngineConfig, EmulationSpec

    spec = ["serve", "engine", "--emulate", "qwen3-8b@h100:tp2"]
    defaults = EmulatedEngineConfig(spec=EmulationSpec.parse("qwen3-8b@h100:tp2"))
    assert served(*spec) == defaults
    got = served(*spec, "--time-scale", "0.5", "--stream-interval-ms", "20")
    assert (got.time_scale, got.stream_interval_s, got.max_running) == (
        0.5,
        0.02,
        defaults.max_running,
    )


def test_the_ray_deployment_takes_the_routers_flags(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.runtime.rollout import ray_deploy

    deployed: list[Any] = []

    def serve_ray(settings: Any, config: Any, announce: Any) -> None:
        deployed.append((settings, config))

    monkeypatch.setattr(ray_deploy, "serve_ray", serve_ray)
    args = ["serve", "rollout", "--ray", "--engines", "3", "--tp", "2", "--engine-kind", "standin"]
    assert invoke(*args, "--engine-arg=--dtype", "--placement", "rose").exit_code == 0
    settings, config = deployed[-1]
    assert settings.placement.value == "rose"
    assert (config.engines, config.tp, config.launcher.value) == (3, 2, "standin")
    assert config.max_running == ray_deploy.RayDeployConfig().max_running  # not given
    assert config.vllm is not None and config.vllm.extra_args == ("--dtype",)
