"""The engine launcher: its configuration, its command line, its errors, and an engine that
ends with its launcher however the launcher dies."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from process_tree import descendants, wait_gone

from loom.core.errors import ConfigError
from loom.runtime.engine import (
    INSTALL_HINT,
    EngineConfig,
    EngineProcess,
    EngineStartError,
    EngineUnavailableError,
    engine_available,
    free_port,
    launcher,
)


@pytest.mark.parametrize(
    "field",
    [
        {"port": -1},
        {"port": 70000},
        {"max_running": 0},
        {"gpu_memory_utilization": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"max_model_len": 0},
        {"startup_timeout_s": 0},
        {"cpus": "first"},
        {"cpus": "0-"},
        {"tensor_parallel_size": 0},
        {"devices": "gpu0"},
        {"device": "tpu"},
    ],
)
def test_config_refuses_bad_values(field: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(field))):
        EngineConfig(**field)  # type: ignore[arg-type]


def test_command_line_carries_the_flags(tmp_path: Path) -> None:
    cfg = EngineConfig(
        max_running=3, priority=True, gpu_memory_utilization=0.2, state_dir=tmp_path, device="cpu"
    )
    cmd = cfg.command(Path("/m"), 1234)
    joined = " ".join(cmd)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for part in (
        "--model /m",
        "--port 1234",
        "--host 127.0.0.1",
        "--max-num-seqs 3",
        "--scheduling-policy priority",
        "--gpu-memory-utilization 0.2",
        "--dtype float32",
        "--enforce-eager",
    ):
        assert part in joined
    assert "--scheduling-policy priority" in " ".join(EngineConfig().command(Path("/m"), 1))
    assert "--scheduling-policy" not in EngineConfig(priority=False).command(Path("/m"), 1)
    assert cfg.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    assert EngineConfig(cpus="1", device="cpu").environment()["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert cfg.cache_dir == tmp_path / "engine-model"
    # the CPU build's own share of host memory where none is given
    assert "--gpu-memory-utilization 0.1" in " ".join(
        EngineConfig(device="cpu").command(Path("/m"), 1)
    )


def test_on_gpus_the_engine_runs_as_vllm_does_there() -> None:
    """Another vLLM build (a training environment's, on GPUs): the model's dtype, CUDA graphs,
    vLLM's own memory share, the GPUs named, sharded over `tensor_parallel_size`, and nothing
    of the CPU build's settings; the weight-sync extension and dev mode as on the CPU."""
    cfg = EngineConfig(device="gpu", tensor_parallel_size=2, devices="2,3", weight_sync=True)
    cmd = " ".join(cfg.command(Path("/m"), 1))
    for absent in ("--dtype", "--enforce-eager", "--gpu-memory-utilization"):
        assert absent not in cmd
    assert "--tensor-parallel-size 2" in cmd
    assert "--worker-extension-cls loom.runtime.engine.weight_sync.WeightSync" in cmd
    env = cfg.environment()
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    given = EngineConfig(device="gpu", gpu_memory_utilization=0.8).command(Path("/m"), 1)
    assert "--gpu-memory-utilization 0.8" in " ".join(given)


def test_auto_follows_the_installed_vllm_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    installed: set[str] = set()

    def distribution(name: str) -> object:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return object()

    monkeypatch.setattr(launcher.metadata, "distribution", distribution)
    assert launcher.vllm_build() is None
    assert EngineConfig().resolved_device == "cpu"  # none: starting says what to install
    installed.add("vllm")
    assert EngineConfig().resolved_device == "gpu"
    installed.add("vllm-cpu")
    assert EngineConfig().resolved_device == "cpu"
    assert EngineConfig(device="gpu").resolved_device == "gpu"


def test_missing_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "engine_available", lambda: False)
    with pytest.raises(EngineUnavailableError, match=INSTALL_HINT.replace("[", r"\[")):
        EngineProcess.start()


def test_a_port_in_use_is_refused_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "require_engine", lambda: None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(EngineStartError, match=f"port {port} .* in use"):
            EngineProcess.start(port=port)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}")
def test_an_engine_that_fails_to_start_says_why(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError) as info:
        EngineProcess.start(
            extra_args=("--no-such-flag",), startup_timeout_s=240, log_path=tmp_path / "log"
        )
    message = str(info.value)
    assert "exited with code" in message
    assert "--no-such-flag" in message  # vLLM's own complaint, from the log's tail
    assert str(tmp_path / "log") in message  # the log is kept and named
    assert "did not" not in message  # it saw the exit, not its startup deadline


def test_cli_serve_engine_checks_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from loom.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["serve", "engine", "--max-running", "0"])
    assert bad.exit_code == 2 and "max_running" in bad.output
    bad = runner.invoke(app, ["serve", "engine", "--cpus", "one"])
    assert bad.exit_code == 2 and "cpus" in bad.output
    assert "--no-priority" in runner.invoke(app, ["serve", "engine", "--help"]).output
    monkeypatch.setattr(launcher, "engine_available", lambda: False)
    missing = runner.invoke(app, ["serve", "engine"])
    assert missing.exit_code == 1 and INSTALL_HINT in " ".join(missing.output.split())


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}")
def test_sigkill_of_loom_serve_engine_ends_its_engine(tmp_path: Path) -> None:
    # as an out-of-memory killer ends it: nothing of the launcher runs its cleanup
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "loom.cli", "serve", "engine", "--port", str(port)]
    with (tmp_path / "serve.log").open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    tree = []
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            log = (tmp_path / "serve.log").read_text(errors="replace")
            assert proc.poll() is None, f"loom serve engine exited:\n{log}"
            assert time.monotonic() < deadline, f"the engine was not healthy in time:\n{log}"
            time.sleep(0.5)
        tree = descendants(proc.pid)
        commands = " | ".join(p.command for p in tree)
        # the tether, vLLM's API server, its engine core and worker (and a resource tracker)
        assert len(tree) >= 4 and "vllm.entrypoints.openai.api_server" in commands, commands
        proc.kill()
        proc.wait()
        assert wait_gone(tree, timeout_s=60) == {}, "processes of the engine outlived it"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2, trust_env=False)
    finally:
        proc.kill()
        proc.wait()
        for p in tree:
            if p.alive:
                p.kill()
