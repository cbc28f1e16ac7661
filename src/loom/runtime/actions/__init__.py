"""The action server (ARL-Tangram's runtime): RL frameworks submit tool and reward actions over
HTTP; an action policy schedules them and this package runs them on real pinned processes,
torch services restored on demand, and rate-limited API calls."""

from loom.runtime.actions.app import create_app
from loom.runtime.actions.config import (
    ActionServerConfig,
    ApiLimitConfig,
    GpuNodeConfig,
    GpuServiceConfig,
    ServiceModelKind,
    load_config,
)
from loom.runtime.actions.driver import ActionDriver, ServerClosingError, UnknownActionError
from loom.runtime.actions.schemas import ActionRequest, ActionView, StatusName
from loom.runtime.actions.server import BackgroundServer, serve

__all__ = [
    "ActionDriver",
    "ActionRequest",
    "ActionServerConfig",
    "ActionView",
    "ApiLimitConfig",
    "BackgroundServer",
    "GpuNodeConfig",
    "GpuServiceConfig",
    "ServerClosingError",
    "ServiceModelKind",
    "StatusName",
    "UnknownActionError",
    "create_app",
    "load_config",
    "serve",
]
