"""Settings files shared by Loom's services: a pydantic model read from TOML or JSON, with
command-line overrides; every failure is a `ConfigError` naming where the bad value came
from."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loom.core.errors import ConfigError

__all__ = ["load_settings", "override", "validated"]

M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: dict[str, Any], what: str, source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid {what} config ({source}):\n{exc}") from None


def override(settings: M, what: str, **values: Any) -> M:
    """A copy with the given fields replaced (None leaves a field as it is), validated."""
    data = settings.model_dump()
    data.update({k: v for k, v in values.items() if v is not None})
    return validated(type(settings), data, what, "command-line options")


def load_settings(model: type[M], path: Path, what: str) -> M:
    """Read a `.toml` or `.json` file into a validated `model`."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix != ".json" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot parse config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a table of settings")
    return validated(model, data, what, str(path))
