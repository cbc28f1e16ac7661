"""The action server's wire format: what clients submit and what they read back."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, model_validator

from loom.core.actions import ActionKind, ActionStatus

__all__ = [
    "ActionAccepted",
    "ActionRequest",
    "ActionView",
    "ApiCall",
    "CpuRange",
    "HttpMethod",
    "ServerStats",
    "ServiceCall",
    "StatusName",
    "TrajectoryEnded",
]

TrajectoryId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="names the trajectory (and its workspace directory)",
    ),
]


class StatusName(StrEnum):
    """`ActionStatus` as it appears on the wire."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @classmethod
    def of(cls, status: ActionStatus) -> StatusName:
        return cls(status.name.lower())


MAX_TIMEOUT_S = 86_400.0  # a day: longer is a mistake, not a tool call


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL byte")
    return value


def _env_key(value: str) -> str:
    if "=" in value:
        raise ValueError(f"environment variable names cannot contain '=' (got {value!r})")
    return _no_nul(value)


# Strings that reach execve: no NUL byte (the kernel would cut them short, Python refuses).
Arg = Annotated[str, AfterValidator(_no_nul)]
EnvKey = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_env_key)]


class _Request(BaseModel):
    # NaN and infinities are refused: no duration, size or count is either
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CpuRange(_Request):
    """An elastic core demand: the scheduler picks a count in [min, max]."""

    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> CpuRange:
        if self.max < self.min:
            raise ValueError(f"cpu.max ({self.max}) must be >= cpu.min ({self.min})")
        return self


class ServiceCall(_Request):
    """A call of a named GPU service; `gpus` is one degree or the degrees it may run at."""

    name: str = Field(min_length=1)
    gpus: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] = 1
    input: JsonValue = None

    def degrees(self) -> tuple[int, ...]:
        return (self.gpus,) if isinstance(self.gpus, int) else tuple(self.gpus)


class HttpMethod(StrEnum):
    GET = "GET"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


class ApiCall(_Request):
    """An outbound HTTP call under the named quota."""

    name: str = Field(min_length=1, description="the API quota it counts against")
    url: str = Field(pattern=r"^https?://", description="http(s) URL")
    method: HttpMethod = HttpMethod.POST
    body: JsonValue = None
    headers: dict[str, str] = Field(default_factory=dict)


class ActionRequest(_Request):
    """One action: a command (CPU tool), a service call (GPU) or an API call."""

    trajectory_id: TrajectoryId
    command: list[Arg] | None = Field(default=None, min_length=1, description="argv")
    cpu: Annotated[int, Field(ge=1)] | CpuRange = Field(
        default=1, description="cores: a count, or {min, max} for an elastic action"
    )
    memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="the trajectory's memory over all its processes (its cgroup's limit)",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_TIMEOUT_S, description="execution time limit (at most a day)"
    )
    t_ori_s: float | None = Field(
        default=None, ge=0, description="profiled duration on one unit of the key resource"
    )
    elasticity: dict[int, float] | str | None = Field(
        default=None,
        description='E(m): a table {units: E}, "linear" or "amdahl:P" (P the parallel part)',
    )
    parallel_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable set to the granted core count",
    )
    env: dict[EnvKey, Arg] = Field(
        default_factory=dict, description="extra environment (keys without '=' or NUL)"
    )
    network: bool = Field(
        default=False, description="the sandboxed command may use the network (off by default)"
    )
    service: ServiceCall | None = None
    api: ApiCall | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ActionRequest:
        given = [n for n in ("command", "service", "api") if getattr(self, n) is not None]
        if not given:
            raise ValueError(
                "missing command: an action needs one of command (a CPU tool), "
                "service (a GPU service call) or api (an API call)"
            )
        if len(given) > 1:
            raise ValueError(f"give exactly one of command, service, api (got {given})")
        if self.command is not None and not self.command[0]:
            raise ValueError("command[0] (the program) must not be empty")
        return self

    @property
    def kind(self) -> ActionKind:
        if self.service is not None:
            return ActionKind.GPU_SERVICE
        if self.api is not None:
            return ActionKind.API
        return ActionKind.CPU_TOOL


class ActionAccepted(BaseModel):
    id: str
    status: StatusName


class ActionView(BaseModel):
    """An action's state. Times `*_at` are Unix seconds; durations split its completion time
    `act_s` = `queue_s` (waiting for resources) + `overhead_s` (grant to execution start:
    spawning, service restore) + `exec_s` (execution)."""

    id: str
    trajectory_id: str
    kind: ActionKind
    status: StatusName
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    result: JsonValue = None
    error: str | None = None
    units: int | None = Field(default=None, description="units of the key resource granted")
    cores: list[int] = Field(default_factory=list)
    gpus: list[int] = Field(default_factory=list)
    domain: str | None = Field(default=None, description="CPU node, GPU node or API granted")
    restored: bool = Field(default=False, description="the service was restored to the device")
    expected_s: float | None = Field(default=None, description="the policy's duration estimate")
    submitted_at: float
    scheduled_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    queue_s: float | None = None
    overhead_s: float | None = None
    exec_s: float | None = None
    act_s: float | None = None


class TrajectoryEnded(BaseModel):
    trajectory_id: str
    cancelled: list[str] = Field(description="its actions that were queued or running")
    workspace_removed: bool


class ServerStats(BaseModel):
    policy: str
    queued: int
    running: int
    finished: int
    cores: list[int]
    busy_cores: list[int]
    api: dict[str, dict[str, Any]]
    services: list[str]
    resident: list[dict[str, Any]] = Field(
        description="service instances on devices: node, service, degree, first GPU"
    )
    gpu_services_available: bool
    gpu_services_note: str | None = None
    sandbox: str = Field(description="how CPU actions are isolated: bwrap or none")
    cgroups: int | None = Field(description="the cgroup version containing actions; None: none")
    containment_note: str | None = Field(
        default=None, description="what is not contained here, and why"
    )
