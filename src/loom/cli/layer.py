"""Settings from a config file with the flags a user gave laid over it: the one way every
`loom serve` builds its settings, pydantic models and dataclasses alike (both validated by
`loom.core.settings`). Only a flag the user gave sets its field: a flag left at its default
leaves the file's value, or the model's default, alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import typer

from loom.core.errors import ConfigError

__all__ = ["Flag", "Layering", "Note", "default_of", "given", "one_of", "option_name"]

T = TypeVar("T")
# text `--help` adds to a parameter's, worked out when help is shown (see `command.py`)
Note = Callable[[], str]


@dataclass(frozen=True)
class Flag:
    """A command-line parameter that sets one field of a service's settings."""

    param: str | None = None  # the command's parameter; None: the field's name
    convert: Callable[..., Any] | None = None  # the flag's value (and `uses`') to the field's
    uses: tuple[str, ...] = ()  # other parameters `convert` takes after the flag's value
    choices: Callable[[], Iterable[str]] | None = None  # what it accepts, listed by --help
    shown: Callable[[Any], str] | None = str  # the field's default in --help; None: not shown


@dataclass(frozen=True)
class Layering(Generic[T]):
    """How a command's flags set the fields of its settings `model`, a pydantic model or a
    dataclass, imported when needed (a settings model imports its policies)."""

    what: str  # the settings' owner in messages, e.g. "rollout router"
    model: Callable[[], type[T]]
    flags: Mapping[str, Flag] = field(default_factory=dict)  # by field

    def build(self, ctx: typer.Context, config: Path | None = None, **values: Any) -> T:
        """The settings of `config` (None: the model's defaults) with every flag the user gave
        laid over them, then `values` the command worked out from its flags (None: not given);
        a `ConfigError` with a line per bad value, saying where it came from."""
        from loom.core.settings import read_table, validated

        data = read_table(config) if config is not None else {}
        sources = dict.fromkeys(data, f"in {config}")
        for name, flag in self.flags.items():
            param = flag.param or name
            if not given(ctx, param):
                continue
            value = ctx.params[param]
            if flag.convert is not None:
                try:
                    value = flag.convert(value, *(ctx.params[p] for p in flag.uses))
                except ConfigError as exc:
                    raise ConfigError(f"{option_name(ctx, param)}: {exc}") from None
            data[name] = value
            sources[name] = f"from {option_name(ctx, param)}"
        for name, value in values.items():
            if value is not None:
                data[name] = value
                sources[name] = "from the command line"
        return validated(self.model(), data, self.what, sources)

    def notes(self) -> dict[str, Note]:
        """What `--help` adds to each flag's help: the values it accepts and the model's
        default, read from the model when help is shown."""
        return {
            flag.param or name: _note(self.model, name, flag) for name, flag in self.flags.items()
        }


def given(ctx: typer.Context, param: str) -> bool:
    """Whether the user gave `param` (on the command line or in its environment variable)."""
    source = ctx.get_parameter_source(param)
    # NOTE: by name: typer carries its own copy of click's ParameterSource
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def option_name(ctx: typer.Context, param: str) -> str:
    """How the user writes `param`: `--placement`, `--priority/--no-priority`."""
    for p in ctx.command.params:
        if p.name == param:
            secondary = getattr(p, "secondary_opts", None)
            return "/".join([p.opts[0], *secondary[:1]]) if secondary else p.opts[0]
    return param


def one_of(values: Iterable[str]) -> str:
    return "one of: " + ", ".join(values)


def _note(model: Callable[[], type[Any]], name: str, flag: Flag) -> Note:
    def note() -> str:
        parts = [one_of(flag.choices())] if flag.choices is not None else []
        default = default_of(model(), name)
        if flag.shown is not None and default is not None:
            parts.append(f"default: {flag.shown(getattr(default, 'value', default))}")
        return "; ".join(parts)

    return note


def default_of(model: type[Any], name: str) -> Any:
    """The default of `model`'s field `name` (None where it has none)."""
    if dataclasses.is_dataclass(model):
        f = next(f for f in dataclasses.fields(model) if f.name == name)
        if f.default is not dataclasses.MISSING:
            return f.default
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else None
    info = model.model_fields[name]
    return None if info.is_required() else info.get_default(call_default_factory=True)
