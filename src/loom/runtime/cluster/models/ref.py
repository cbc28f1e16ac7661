"""What a deployment's `model` names, parsed and checked where it is created (without
importing torch or the model): `tiny` (the built-in decoder), a local Hugging Face model
directory, or a worker class `module:Class` (a `ModelWorker` subclass importable by the
worker processes). `build` makes the worker in a rank."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from loom.runtime.cluster.models.worker import ModelWorker

__all__ = ["BUILTIN_MODEL", "ModelInfo", "ModelKind", "ModelRef", "parse_model"]

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

    def build(self, *, seed: int, device: torch.device, options: dict[str, Any]) -> ModelWorker:
        """The rank's worker (in a worker process: imports torch and the model)."""
        from loom.runtime.cluster.models.worker import ModelWorker

        cls: Any
        if self.kind is ModelKind.BUILTIN:
            from loom.runtime.cluster.models.tiny import TinyWorker

            cls = TinyWorker
        elif self.kind is ModelKind.HF:
            from loom.runtime.cluster.models.hf import HFWorker

            cls, options = HFWorker, {"path": self.target, **options}
        else:
            cls = _load_class(self.target)
            if not (isinstance(cls, type) and issubclass(cls, ModelWorker)):
                raise ConfigError(
                    f"{self.target} is not a ModelWorker subclass "
                    "(loom.runtime.cluster.models.ModelWorker)"
                )
        try:
            worker: ModelWorker = cls(seed=seed, device=device, **options)
        except TypeError as exc:
            raise ConfigError(f"cannot build {self.target} with {sorted(options)}: {exc}") from exc
        if not hasattr(worker, "module") or not hasattr(worker, "vocab_size"):
            raise ConfigError(f"{self.target} must set self.module and self.vocab_size")
        return worker


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


def _load_class(target: str) -> Any:
    module, _, qual = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"model {target!r}: {module} has no {qual}") from None
    return obj
