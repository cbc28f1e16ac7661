"""What a deployment's `model` names, parsed and checked where it is created (without
importing torch or the model): `tiny` (the built-in decoder), a local Hugging Face model
directory, or a worker class `module:Class` (a `ModelWorker` subclass importable by the
worker processes). `models.build.build_worker` makes the worker in a rank."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from loom.core.errors import ConfigError

__all__ = ["BUILTIN_MODEL", "ModelInfo", "ModelKind", "ModelRef", "load_class", "parse_model"]

BUILTIN_MODEL = "tiny"
_CLASS = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """What the service checks payloads against (sent by rank 0 once it has built its model)."""

    kind: str  # the worker's class, `module:Class`
    vocab: int  # token ids are in [0, vocab)
    params: int  # parameters (elements)
    bytes: int  # bytes of the parameters
    tp_split: int | None  # every tensor-parallel degree must divide it (None: no TP layout)


class ModelKind(StrEnum):
    BUILTIN = "builtin"  # the tiny decoder built in code
    HF = "hf"  # a local Hugging Face model directory
    CLASS = "class"  # a user's ModelWorker subclass


@dataclass(frozen=True)
class ModelRef:
    kind: ModelKind
    target: str  # "tiny", the directory (absolute), or "module:Class"


def parse_model(model: str) -> ModelRef:
    """The model a deployment names; `ConfigError` saying why when it cannot be one."""
    if model == BUILTIN_MODEL:
        return ModelRef(ModelKind.BUILTIN, model)
    if _CLASS.fullmatch(model):
        module = model.split(":", 1)[0]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"model {model!r}: cannot find module {module!r} ({exc})") from None
        if found is None:
            raise ConfigError(
                f"model {model!r}: no module {module!r} is importable here (a worker class is "
                "`module:Class` on the workers' Python path)"
            )
        return ModelRef(ModelKind.CLASS, model)
    where = Path(model).expanduser()
    if not where.is_dir():
        raise ConfigError(
            f"model {model!r} is neither {BUILTIN_MODEL!r} (the built-in decoder), a worker "
            "class `module:Class`, nor a local model directory (nothing is downloaded: give "
            "the directory of a Hugging Face model)"
        )
    if not (where / "config.json").is_file():
        raise ConfigError(f"model {model!r}: the directory has no config.json")
    return ModelRef(ModelKind.HF, str(where.resolve()))


def load_class(target: str) -> Any:
    """The object `module:Qual.Name` names (ConfigError when the module lacks it)."""
    module, _, qual = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"model {target!r}: {module} has no {qual}") from None
    return obj
