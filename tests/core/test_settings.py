"""Settings from files and flags, pydantic models and dataclasses alike: one readable line per
bad value, saying the setting, the value, where it came from and what is accepted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from loom.core.errors import ConfigError
from loom.core.settings import load_settings, validated


class Server(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(default=1, ge=0)
    mode: str = Field(default="a", pattern="^(a|b)$")
    token: str | None = Field(default=None, min_length=16)


@dataclass(frozen=True, kw_only=True)
class Engine:
    max_running: int = 16
    cpus: str = "auto"

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ConfigError(f"max_running must be >= 1, got {self.max_running}")


def test_a_model_and_a_dataclass_are_validated_the_same_way() -> None:
    assert validated(Server, {"port": "7"}, "server", "x").port == 7
    assert validated(Engine, {"max_running": "5"}, "engine", "x") == Engine(max_running=5)
    with pytest.raises(ConfigError, match=r"max_running = 'x' \(from --max-running\)"):
        validated(Engine, {"max_running": "x"}, "engine", {"max_running": "from --max-running"})
    with pytest.raises(ConfigError, match=r"^invalid engine settings: max_running must be >= 1"):
        validated(Engine, {"max_running": 0}, "engine", "x")


@pytest.mark.parametrize("model", [Server, Engine])
def test_an_unknown_setting_is_refused_with_a_suggestion(model: type) -> None:
    known = "port" if model is Server else "max_running"
    typo = known[:-1]
    with pytest.raises(ConfigError) as info:
        validated(model, {typo: 1}, "x", f"in {typo}.toml")
    message = str(info.value)
    assert f"{typo} = 1 (in {typo}.toml)" in message and f"did you mean {known}?" in message


def test_one_line_per_error_without_pydantics_dump(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('port = -1\nmode = "c"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(Server, path, "server")
    lines = str(info.value).splitlines()
    assert lines == [
        "invalid server settings:",
        f"  port = -1 (in {path}): Input should be greater than or equal to 0",
        f"  mode = 'c' (in {path}): String should match pattern '^(a|b)$'",
    ]
    assert "pydantic" not in str(info.value)


def test_a_token_is_never_shown() -> None:
    with pytest.raises(ConfigError) as info:
        validated(Server, {"token": "hunter2"}, "server", "from --token")
    assert "hunter2" not in str(info.value) and "token = '***'" in str(info.value)
