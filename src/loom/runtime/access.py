"""Who may use a Loom service: one bearer token for every service, one rule for exposure.

Every service's settings carry `Access`: `token` (`--token` or `LOOM_TOKEN`; every request but
health and metrics must send `Authorization: Bearer <token>`, else a 401 that says so),
`open_health` (health and metrics answer without the token; False: they need it too) and
`allow_open`. Binding beyond loopback without a token is refused, saying how to fix it;
`allow_open` serves anyway, with a loud warning at start. The check is the same function for
the FastAPI services (`BearerToken`, in `service.py`) and the aiohttp router."""

from __future__ import annotations

import hmac
import ipaddress
import logging

from pydantic import BaseModel, Field, model_validator

__all__ = [
    "HEALTH_PATHS",
    "UNAUTHORIZED",
    "Access",
    "authorized",
    "is_loopback",
    "is_open",
    "warn_if_open",
]

log = logging.getLogger("loom.access")

# health probes (Loom's, SGLang's and the gateways') and Prometheus scrapes
HEALTH_PATHS = frozenset(
    {"/health", "/healthz", "/health_generate", "/readiness", "/liveness", "/metrics"}
)
UNAUTHORIZED = "missing or wrong token: send Authorization: Bearer <token> (--token or LOOM_TOKEN)"


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a service on this machine (a host name may resolve
    anywhere, so only `localhost` and loopback addresses count)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authorized(header: str | bytes | None, token: str) -> bool:
    """Whether an `Authorization` header carries `token` (compared in constant time)."""
    if header is None:
        return False
    given = header.encode() if isinstance(header, str) else header
    return hmac.compare_digest(given, f"Bearer {token}".encode())


def is_open(path: str, open_health: bool) -> bool:
    """Whether `path` answers without the token."""
    return open_health and path in HEALTH_PATHS


class Access(BaseModel):
    """The access settings every service shares (mixed into its settings)."""

    token: str | None = Field(
        default=None,
        min_length=16,
        repr=False,
        description="bearer token every request but health and metrics must send (--token or "
        "LOOM_TOKEN); needed beyond loopback",
    )
    open_health: bool = Field(
        default=True, description="health and metrics answer without the token"
    )
    allow_open: bool = Field(
        default=False,
        description="serve beyond loopback without a token (a loud warning at start)",
    )

    @model_validator(mode="after")
    def _exposure(self) -> Access:
        host = str(getattr(self, "host", "127.0.0.1"))
        if self.token is None and not is_loopback(host) and not self.allow_open:
            raise ValueError(
                f"binding {host} (beyond loopback) without a token lets whoever can reach it "
                "use this service: give a token (--token or LOOM_TOKEN, 16 characters or more), "
                "or pass --allow-open to serve it open anyway"
            )
        return self


def warn_if_open(settings: Access, service: str) -> bool:
    """At start: say loudly that `service` is open to whoever can reach it. Whether it is."""
    host = str(getattr(settings, "host", "127.0.0.1"))
    if settings.token is not None or is_loopback(host):
        return False
    log.warning(
        "!!! the %s binds %s WITHOUT A TOKEN: whoever can reach this address can use it "
        "(--allow-open). Give --token or LOOM_TOKEN to close it.",
        service,
        host,
    )
    return True
