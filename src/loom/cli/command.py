"""What every `loom` command shares: `--help` that lists what each option accepts, read from the
registries and settings models when help is shown (importing a registry takes a second; a
command line is read without one), and Loom's errors turned into messages that say what was
wrong and how to fix it, never a traceback or a raw validation dump."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

from loom.cli.layer import Note
from loom.core.errors import ConfigError, LoomError, MissingExtraError, UnknownPolicyError

__all__ = ["LoomCommand", "Rejected", "add_command"]

log = logging.getLogger(__name__)


class Rejected(typer.BadParameter):
    """Bad settings or input: exits 2 with the message alone (it names the setting itself)."""

    def format_message(self) -> str:
        return self.message


class LoomCommand(TyperCommand):
    """A `loom` command. `notes` add to an option's help (by parameter name) what it accepts."""

    notes: ClassVar[Mapping[str, Note]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._noted = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if not self._noted:
            self._add_notes()
        super().format_help(ctx, formatter)

    def _add_notes(self) -> None:
        self._noted = True
        for param in self.params:
            note = self.notes.get(param.name or "")
            if note is None:
                continue
            text = note()
            if text and self.rich_markup_mode == "rich":
                text = escape(text)
            help_ = getattr(param, "help", None)
            if text:
                param.help = f"{help_} ({text})" if help_ else text  # type: ignore[attr-defined]

    def invoke(self, ctx: Any) -> Any:
        from pydantic import ValidationError

        from loom.core.settings import describe

        try:
            return super().invoke(ctx)
        except MissingExtraError as exc:
            _fail(exc)
        except (ConfigError, UnknownPolicyError) as exc:
            raise Rejected(str(exc), ctx=ctx) from None
        except ValidationError as exc:  # a library's settings, validated outside `layer`
            message = f"invalid {exc.title} settings: {'; '.join(describe(exc))}"
            raise Rejected(message, ctx=ctx) from None
        except LoomError as exc:
            _fail(exc)


def add_command(
    app: typer.Typer,
    name: str,
    callback: Callable[..., Any],
    notes: Mapping[str, Note] | None = None,
) -> None:
    """Register `callback` as `app`'s command `name`, its options' help completed by `notes`."""
    cls = type(f"{callback.__name__}_command", (LoomCommand,), {"notes": dict(notes or {})})
    app.command(name, cls=cls)(callback)


def _fail(exc: LoomError) -> NoReturn:
    log.debug("command failed", exc_info=exc)
    Console(stderr=True).print(str(exc), style="red", markup=False, highlight=False)
    raise typer.Exit(1) from None
