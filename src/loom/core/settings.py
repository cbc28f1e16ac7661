"""Settings files shared by Loom's services: a pydantic model (or a dataclass, which pydantic
validates the same way) read from TOML or JSON, with command-line values laid over it; every
failure is a `ConfigError` with one readable line per bad value: the setting, the value given
and where it came from, and what is accepted."""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from loom.core.errors import ConfigError

__all__ = ["describe", "load_settings", "override", "read_table", "validated"]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# NOTE: pydantic's own prefixes say nothing a reader needs
_PREFIXES = ("Value error, ", "Assertion failed, ")
_SECRETS = ("token",)  # never echoed back, even when invalid
_MAX_VALUE = 60


def read_table(path: Path) -> dict[str, Any]:
    """A `.toml` or `.json` file's table of settings."""
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
    return data


def validated(
    model: type[T], data: Mapping[str, Any], what: str, source: str | Mapping[str, str]
) -> T:
    """`model` (a pydantic model or a dataclass) from `data`. `source` says where the values
    came from: one place for all, or a place per top-level setting (a file, a flag)."""
    sources = source if isinstance(source, Mapping) else dict.fromkeys(data, source)
    if dataclasses.is_dataclass(model):
        # NOTE: pydantic ignores unknown keys of a plain dataclass; a typo must not pass
        known = [f.name for f in dataclasses.fields(model) if f.init]
        unknown = [key for key in data if key not in known]
        if unknown:
            lines = [_unknown_line(key, data[key], sources.get(key), known) for key in unknown]
            raise ConfigError(_message(what, lines))
    try:
        return TypeAdapter(model).validate_python(dict(data))
    except ValidationError as exc:
        raise ConfigError(_message(what, describe(exc, sources, _known(model)))) from None


def override(settings: M, what: str, **values: Any) -> M:
    """A copy with the given fields replaced (None leaves a field as it is), validated."""
    data = settings.model_dump()
    data.update({k: v for k, v in values.items() if v is not None})
    return validated(type(settings), data, what, {})


def load_settings(model: type[M], path: Path, what: str) -> M:
    """Read a `.toml` or `.json` file into a validated `model`."""
    return validated(model, read_table(path), what, f"in {path}")


def describe(
    exc: ValidationError, sources: Mapping[str, str] | None = None, known: list[str] | None = None
) -> list[str]:
    """One readable line per error of `exc`: `setting = value (where): what is accepted`.
    `sources` says where each top-level setting came from; `known` are the settings' names
    (suggested for an unknown one)."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        msg = err["msg"]
        for prefix in _PREFIXES:
            msg = msg.removeprefix(prefix)
        if not loc:  # the model's own check across settings: its message names them
            lines.append(msg)
            continue
        where = (sources or {}).get(str(loc[0]))
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            lines.append(_unknown_line(str(loc[0]), err["input"], where, known or []))
            continue
        value = "missing" if err["type"] == "missing" else _shown(loc, err["input"])
        lines.append(f"{_name(loc)} = {value}{_where(where)}: {msg}")
    return lines


def _known(model: type[Any]) -> list[str]:
    if dataclasses.is_dataclass(model):
        return [f.name for f in dataclasses.fields(model) if f.init]
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _unknown_line(key: str, value: object, where: str | None, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(known)}"
    shown = f"{key} = {_shown((key,), value)}{_where(where)}"
    return f"{shown}: Extra inputs are not permitted ({hint})"


def _message(what: str, lines: list[str]) -> str:
    if len(lines) == 1:
        return f"invalid {what} settings: {lines[0]}"
    return f"invalid {what} settings:\n" + "\n".join(f"  {line}" for line in lines)


def _name(loc: tuple[int | str, ...]) -> str:
    out = str(loc[0])
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _where(where: str | None) -> str:
    return f" ({where})" if where else ""


def _shown(loc: tuple[int | str, ...], value: object) -> str:
    if any(isinstance(p, str) and p.endswith(_SECRETS) for p in loc):
        return "'***'"
    text = repr(str(value) if isinstance(value, Path) else value)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."
