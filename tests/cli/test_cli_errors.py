"""A bad value stops a command with one line that names the setting, the value given, where it
came from and what is accepted: never a traceback, never pydantic's raw dump."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import error_lines, flat, invoke

PLACEMENTS = ("heddle", "cache_aware", "least_load", "hybrid", "rose")


def refused(*args: str) -> str:
    """The one line `loom ARGS` is refused with (exit 2, as every bad parameter)."""
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # not an exception that escaped
    assert "errors.pydantic.dev" not in result.output and "validation error" not in result.output
    assert "Traceback" not in result.output
    lines = error_lines(result.output)
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_bad_placement_names_the_flag_and_every_placement() -> None:
    line = refused("serve", "rollout", "--placement", "nowhere")
    assert "placement = 'nowhere' (from --placement)" in line
    assert all(f"'{p}'" in line for p in PLACEMENTS)


@pytest.mark.parametrize("policy", ["fastest", "k8s"])
def test_a_bad_action_policy_names_what_the_server_drives(policy: str) -> None:
    line = refused("serve", "actions", "--policy", policy, "--sandbox", "none")
    assert f"policy = '{policy}' (from --policy)" in line
    assert "the server drives tangram, tangram_lookahead, dop4, dop16" in line


def test_a_bad_cluster_policy_names_every_policy() -> None:
    line = refused("serve", "cluster", "--policy", "lifo")
    assert "policy = 'lifo' (from --policy)" in line and "'round_robin'" in line


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("http://127.0.0.1:9,colour=red", "unknown option 'colour=red'"),
        ("http://127.0.0.1:9,kind=tgi", "kind = 'tgi': Input should be 'auto', 'vllm' or 'sglang'"),
        ("http://127.0.0.1:9,tp=0", "tp = '0': Input should be greater than or equal to 1"),
        ("127.0.0.1:9", "must start with http:// or https://"),
    ],
)
def test_a_bad_engine_spec_names_the_option_and_what_it_takes(spec: str, said: str) -> None:
    line = refused("serve", "rollout", "--engine", spec)
    assert line.startswith("--engine: ") and said in line
    if "unknown option" in said:  # and the options it does take
        assert "[,kind=auto|vllm|sglang]" in line and "[,lent[=true|false]]" in line


@pytest.mark.parametrize(
    ("command", "text", "said"),
    [
        (["serve", "rollout"], 'placement = "nowhere"\n', "placement = 'nowhere' (in {path})"),
        (["serve", "rollout"], "max_body_mb = 0\n", "max_body_mb = 0 (in {path}): Input should be"),
        (["serve", "relay"], "max_byte = 1\n", "max_byte = 1 (in {path}): Extra inputs"),
        (["serve", "cluster"], "groups = 'two'\n", "groups = 'two' (in {path})"),
        (["serve", "actions"], "retain_s = -1\n", "retain_s = -1 (in {path})"),
        (["serve", "engine"], "max_runnin = 5\n", "did you mean max_running?"),
        (["serve", "engine"], "max_running = 'many'\n", "max_running = 'many' (in {path})"),
        (["serve", "relay"], "port = \n", "cannot parse config {path}"),
    ],
)
def test_a_bad_config_file_names_the_file_and_the_setting(
    command: list[str], text: str, said: str, tmp_path: Path
) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    line = refused(*command, "--config", str(path))
    assert said.format(path=path) in line


def test_a_typo_in_a_config_file_is_suggested_its_setting(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text("max_byts = 1\n")
    assert "did you mean max_bytes" in refused("serve", "relay", "--config", str(path))


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "actions", "--sandbox", "none"],
        ["serve", "relay"],
        ["serve", "cluster"],
        ["serve", "rollout"],
        ["serve", "engine"],
        ["serve", "engine", "--emulate", "qwen3-8b@h100"],
    ],
)
def test_an_open_host_without_a_token_says_how_to_fix_it(command: list[str]) -> None:
    line = refused(*command, "--host", "0.0.0.0")
    assert "0.0.0.0" in line and "token" in line and "--allow-open" in line


def test_a_token_is_never_echoed(tmp_path: Path) -> None:
    line = refused("serve", "relay", "--token", "short-secret")
    assert "short-secret" not in line and "token = '***' (from --token)" in line


def test_several_bad_values_are_a_line_each(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    path.write_text('scheduler = "random"\nport = -1\n')
    result = invoke("serve", "rollout", "--config", str(path), "--placement", "nowhere")
    assert result.exit_code == 2
    lines = error_lines(result.output)
    assert lines[0] == "invalid rollout router settings:"
    assert [line.split(" = ")[0] for line in lines[1:]] == ["port", "placement", "scheduler"]


def test_a_bad_run_setting_is_named_too() -> None:
    pytest.importorskip("torch", reason="loom run grpo checks its extras first")
    pytest.importorskip("vllm", reason="loom run grpo checks its extras first")
    out = flat(invoke("run", "grpo", "--steps", "0").output)
    assert "steps = 0" in out and "greater than or equal to 1" in out
    assert "errors.pydantic.dev" not in out
