"""`loom serve` as a user types it: `loom serve rollout --engine URL,opts` with a `--config`
file, the flags overriding the file, the engine's options reaching the router, a clean exit
on SIGTERM; a bad option or setting stops the command with a message naming it; `loom serve
engine --config` keeps the file's settings unless a flag is given."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_access import serve
from typer.testing import CliRunner

from loom.cli import app
from loom.runtime.rollout.standin import StandinProcess


@pytest.fixture(scope="module")
def standin() -> Any:
    with StandinProcess("--step-ms", "1") as engine:
        yield engine


def test_the_engine_spec_and_the_config_file_reach_the_router(
    standin: StandinProcess, tmp_path: Path
) -> None:
    config = tmp_path / "router.toml"
    config.write_text('placement = "least_load"\nscheduler = "pps"\n')
    spec = f"{standin.url},tp=2,max_running=3,id=e7"
    with serve("rollout", "--engine", spec, "--config", str(config), "--scheduler", "fcfs") as (
        proc,
        url,
    ):
        stats = httpx.get(url + "/v1/stats", timeout=30).json()
        assert stats["placement"] == "least_load"  # from the file
        assert stats["scheduler"] == "fcfs"  # the flag wins over the file
        engine = stats["engines"]["e7"]
        assert (engine["url"], engine["tp"], engine["max_running"]) == (standin.url, 2, 3)
        out = httpx.post(
            url + "/generate",
            json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
            timeout=60,
        )
        assert out.status_code == 200 and len(out.json()["output_ids"]) == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--engine", "http://127.0.0.1:9,tp=2,colour=red"], "unknown option 'colour=red'"),
        (["--engine", "http://127.0.0.1:9,tp=zero"], "tp"),
        (["--engine", "http://127.0.0.1:9,queue=-1"], "queue"),
        (["--config", "{config}"], "speed"),
    ],
)
def test_a_bad_option_or_setting_is_named(args: list[str], said: str, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("speed = 11\n")
    args = [a.replace("{config}", str(config)) for a in args]
    out = CliRunner().invoke(
        app, ["serve", "rollout", "--port", "0", *args], env={"COLUMNS": "300"}
    )
    assert out.exit_code != 0
    assert said in out.output


def test_the_engine_keeps_the_files_settings_unless_a_flag_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.runtime.engine import EngineProcess, EngineStartError

    seen: list[Any] = []

    def start(cfg: Any) -> Any:  # stands in for vLLM: what would it have been started with
        seen.append(cfg)
        raise EngineStartError("not started in this test")

    monkeypatch.setattr(EngineProcess, "start", staticmethod(start))
    # (nothing is started: the settings are read where vLLM is not installed too)
    monkeypatch.setattr("loom.core.extras.require", lambda *_: None)
    config = tmp_path / "engine.toml"
    config.write_text("max_running = 5\ngpu_memory_utilization = 0.2\n")
    runner = CliRunner()
    out = runner.invoke(app, ["serve", "engine", "--config", str(config)])
    assert out.exit_code == 1 and "not started in this test" in out.output
    assert (seen[-1].max_running, seen[-1].gpu_memory_utilization) == (5, 0.2)
    out = runner.invoke(app, ["serve", "engine", "--config", str(config), "--max-running", "7"])
    assert (seen[-1].max_running, seen[-1].gpu_memory_utilization) == (7, 0.2)
    config.write_text("max_runnin = 5\n")
    out = runner.invoke(app, ["serve", "engine", "--config", str(config)])
    assert out.exit_code != 0 and "max_runnin" in out.output
