"""The relay's settings (`loom serve relay`): where it listens, how much it may hold, how large
one object may be, and how long a silent member counts as live."""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field

from loom.core.errors import ConfigError
from loom.core.settings import override
from loom.runtime.access import Access

__all__ = ["RelayConfig", "parse_size"]

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from `123`, `64M`, `64MiB`, `1.5G`, `2GB`: every suffix counts in powers of 1024."""
    match = _SIZE.fullmatch(text.strip())
    unit, suffix = (match.group(2).lower(), match.group(3).lower()) if match else ("", "?")
    if match is None or suffix not in ("", "b", "ib") or (suffix == "ib" and not unit):
        raise ConfigError(f"not a size: {text!r} (e.g. 1048576, 64M, 64MiB, 4G)")
    number = match.group(1)
    return int(float(number) * _UNITS[unit])


class RelayConfig(Access):
    """Everything `loom serve relay` needs; every field has a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8079, ge=0, le=65535)
    max_bytes: int = Field(
        default=4 << 30, ge=1, description="memory cap of stored objects (507 beyond)"
    )
    max_object_bytes: int = Field(
        default=1 << 30, ge=1024, description="largest request body, so largest object (413)"
    )
    member_ttl_s: float | None = Field(
        default=None,
        gt=0,
        description="a member not heard from (joined again) this long is gone; None: never",
    )
    auto_collect: bool = Field(
        default=True, description="drop unneeded versions whenever membership changes"
    )

    def with_overrides(self, **values: object) -> RelayConfig:
        """A copy with the given fields replaced (None leaves a field as it is), validated."""
        return override(self, "relay", **values)
