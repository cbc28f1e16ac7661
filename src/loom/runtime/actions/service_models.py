"""Torch modules behind GPU services, by `ServiceModelKind`. torch is imported lazily: without
it the server runs, and rejects GPU service actions."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from pydantic import JsonValue

from loom.core.errors import ConfigError
from loom.runtime.actions.config import GpuServiceConfig, ServiceModelKind

__all__ = [
    "SERVICE_MODELS",
    "TORCH_HINT",
    "MlpReward",
    "ServiceModel",
    "import_torch",
    "torch_available",
]

TORCH_HINT = "GPU service actions need torch, which is not installed (pip install 'loom-rl[torch]')"


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def import_torch() -> ModuleType:
    """torch, or a ConfigError saying how to get it."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ConfigError(TORCH_HINT) from None


class ServiceModel(Protocol):
    def build(self) -> Any:
        """A torch module with this service's (seeded) weights, on the host."""
        ...

    def skeleton(self) -> Any:
        """The same module without storage (on the meta device), to load weights into."""
        ...

    def check_input(self, payload: JsonValue) -> None:
        """Raise ConfigError when `payload` is not an input of this service (no torch needed)."""
        ...

    def infer(self, replicas: Sequence[tuple[Any, Any]], payload: JsonValue) -> JsonValue:
        """Run `payload` on (module, device) replicas, one per GPU of the chunk."""
        ...


@dataclass(frozen=True)
class MlpReward:
    """A reward model stand-in: an MLP mapping each `dim`-vector to a score. With a degree of
    d, the rows of a batch are split over the d replicas (data parallel)."""

    dim: int
    hidden: int
    layers: int
    seed: int
    max_rows: int = 1 << 16

    def _module(self) -> Any:
        nn = import_torch().nn
        widths = [self.dim] + [self.hidden] * self.layers
        parts: list[Any] = []
        for a, b in itertools.pairwise(widths):
            parts += [nn.Linear(a, b), nn.ReLU()]
        parts.append(nn.Linear(widths[-1], 1))
        return nn.Sequential(*parts)

    def build(self) -> Any:
        torch = import_torch()
        module = self._module()
        gen = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for name, p in module.named_parameters():
                fan_in = p.shape[-1]
                if name.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        return module.eval()

    def skeleton(self) -> Any:
        with import_torch().device("meta"):
            return self._module()

    @staticmethod
    def _rows(payload: JsonValue) -> list[JsonValue]:
        """One vector, or a list of them, as a list of rows."""
        batched = isinstance(payload, list) and bool(payload) and isinstance(payload[0], list)
        return list(payload) if batched and isinstance(payload, list) else [payload]

    def check_input(self, payload: JsonValue) -> None:
        rows = self._rows(payload)
        if len(rows) > self.max_rows:
            raise ConfigError(f"input has {len(rows)} rows, more than {self.max_rows}")
        for row in rows:
            if not (
                isinstance(row, list)
                and len(row) == self.dim
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
            ):
                raise ConfigError(
                    f"input must be a vector of {self.dim} numbers or a list of such vectors"
                )

    def infer(self, replicas: Sequence[tuple[Any, Any]], payload: JsonValue) -> JsonValue:
        torch = import_torch()
        x = torch.tensor(self._rows(payload), dtype=torch.float32)
        parts = torch.tensor_split(x, len(replicas))
        with torch.inference_mode():
            scores = [
                module(part.to(device, non_blocking=True)).squeeze(-1).cpu()
                for (module, device), part in zip(replicas, parts, strict=True)
                if len(part)
            ]
        return {"scores": torch.cat(scores).tolist()}


SERVICE_MODELS: Mapping[ServiceModelKind, Callable[[GpuServiceConfig], ServiceModel]] = {
    ServiceModelKind.MLP_REWARD: lambda c: MlpReward(c.dim, c.hidden, c.layers, c.seed),
}
"""How to build each kind of service model from its config."""
