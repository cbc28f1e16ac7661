"""Helpers the baselines share: finding the manager whose testbed they take over."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from loom.actions.managers.base import ResourceManager
from loom.core.errors import ConfigError

__all__ = ["manager_of"]

M = TypeVar("M", bound=ResourceManager)


def manager_of(managers: Sequence[ResourceManager], kind: type[M], policy: str) -> M:
    """The first manager of type `kind`; a baseline reads its nodes and services."""
    for m in managers:
        if isinstance(m, kind):
            return m
    raise ConfigError(f"{policy} needs a {kind.__name__} among the resource managers")
