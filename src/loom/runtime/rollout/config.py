"""The rollout router's settings: its engines, its policies, where it listens and keeps state;
loadable from a TOML or JSON file and overridden by command-line flags."""

from __future__ import annotations

from enum import Enum, StrEnum
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from loom.core.errors import ConfigError
from loom.core.settings import describe, load_settings, override
from loom.rollout.policy import PlacementKind, SchedulerKind
from loom.runtime.access import Access

__all__ = [
    "EngineConfig",
    "EngineKind",
    "FleetConfig",
    "RolloutServerConfig",
    "engine_spec_syntax",
    "load_config",
    "parse_engine",
    "spec_options",
]

EngineId = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


class EngineKind(StrEnum):
    """How the router talks to an engine. `auto` probes: SGLang answers `/get_model_info`,
    vLLM and other OpenAI-compatible servers `/v1/models`."""

    AUTO = "auto"
    VLLM = "vllm"  # OpenAI /v1/completions with token ids, /abort_requests in dev mode
    SGLANG = "sglang"  # native /generate with input_ids and rid, /abort_request


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Settings):
    """One inference engine behind the router."""

    url: str = Field(description="base URL, e.g. http://127.0.0.1:8001")
    id: EngineId | None = Field(default=None, description="name in stats; default e0, e1, ...")
    kind: EngineKind = EngineKind.AUTO
    tp: int = Field(default=1, ge=1, le=1024, description="tensor-parallel degree (GPUs)")
    max_running: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="most turns the router keeps in flight at it; None: as many as it runs "
        "at once by what it says (the limit it states, its load reports: running and waiting "
        "requests, KV-cache use)",
    )
    queue: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="turns sent beyond what it runs at once, to wait in its own queue (in the "
        "priority order the router passes): a slot it frees refills without a round trip "
        "through the router; 0: the router holds every turn the engine would queue",
    )
    priority: bool = Field(
        default=True,
        description="pass the scheduler's key as each request's priority, for an engine that "
        "schedules by it (vLLM --scheduling-policy priority, SGLang "
        "--enable-priority-scheduling; `loom serve engine` does); an SGLang engine that says "
        "it does not, and an engine that refuses the field, get none",
    )
    node: int = Field(default=0, ge=0, description="node it runs on (for migration costs)")
    lent: bool = Field(
        default=False,
        description="a serving instance lent to this job (ROSE): it co-serves, so the rose "
        "placement sends it turns only when the dedicated engines are full and it reports "
        "room and serving-SLO slack",
    )
    version: int | None = Field(
        default=None,
        ge=0,
        description="weight version it serves when added; None: the router's current one",
    )
    token: str | None = Field(
        default=None,
        repr=False,
        description="bearer token the engine wants (vLLM --api-key, `loom serve engine "
        "--token`); sent with every call to it",
    )

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


class FleetConfig(_Settings):
    """Engines the router starts and stops itself, in Heddle's planned layout (§6): the
    model-parallel degree of each, planned for `gpus` from the router's history of finished
    trajectories (`POST /v1/fleet/plan` plans again between steps), or a fixed `layout`."""

    gpus: int = Field(ge=1, le=4096, description="GPUs of the rollout")
    emulate: str | None = Field(
        default=None,
        description="MODEL@GPU (e.g. qwen3-14b@h100): emulated engines of that GPU (`loom serve "
        "engine --emulate`, each at its planned degree); None: vLLM engines (`loom serve "
        "engine`), on the GPUs the layout gives each",
    )
    time_scale: float = Field(
        default=1.0, gt=0, description="emulated engines: wall seconds per GPU second"
    )
    layout: tuple[int, ...] | None = Field(
        default=None,
        description="the degree of each engine (a uniform fleet: 2,2,2,2); None: planned "
        "from the history (with no history yet: every engine at the smallest degree)",
    )
    degrees: tuple[int, ...] = Field(
        default=(1, 2, 4, 8), description="degrees the planner may choose"
    )
    gpus_per_node: int = Field(default=8, ge=1, description="GPUs per node: no engine spans two")
    simulate: bool = Field(
        default=True,
        description="keep the annealed layout only where it serves the latest batch faster in "
        "the simulator than every uniform layout does (`loom plan rollout --simulate`)",
    )
    max_running: int | None = Field(
        default=None, ge=1, description="each engine's cap in the router (None: what it says)"
    )
    engine_args: tuple[str, ...] = Field(
        default=(), description="more arguments for each engine's command line"
    )
    drain_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="a layout change waits this long for an engine's running turns to finish "
        "before it moves them elsewhere",
    )

    @field_validator("layout", "degrees")
    @classmethod
    def _positive(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or min(value) < 1):
            raise ValueError(f"degrees must be >= 1, got {value}")
        return value


class RolloutServerConfig(_Settings, Access):
    """Everything `loom serve rollout` needs; every field has a default but the engines,
    which may also be added while it runs (`POST /v1/engines`)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8800, ge=0, le=65535)
    engines: tuple[EngineConfig, ...] = ()
    placement: PlacementKind = PlacementKind.HEDDLE
    scheduler: SchedulerKind = SchedulerKind.PPS
    state_dir: Path | None = Field(
        default=None, description="trajectory history for the predictor; None: not kept"
    )
    model: str = Field(
        default="qwen3-14b",
        description="model key of the roofline cost model Heddle's placement plans with "
        "when no engine profile is given",
    )
    gpu: str = Field(default="h100", description="GPU type of that cost model")
    profiles: tuple[Path, ...] = Field(
        default=(),
        description="engine profile CSVs, one per TP degree (benchmarks/profile_engine.py), "
        "for Heddle's placement cost; none: the roofline model of `model` on `gpu`",
    )
    max_body_mb: float = Field(default=32.0, gt=0, le=1024, description="largest request body")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="engine connect timeout")
    engine_call_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="deadline of every engine call but a turn's stream (probe, tokenize, "
        "abort): a hung engine never holds a request",
    )
    tokenizer: str | None = Field(
        default=None,
        description="the tokenizer that turns text prompts and chats into token ids in the "
        "router (a path or a Hugging Face name); None: where the first engine loaded its "
        "model; 'engine': ask an engine's /tokenize instead",
    )
    first_token_timeout_s: float = Field(
        default=600.0, gt=0, description="a turn with no first token this long has stalled"
    )
    stall_timeout_s: float = Field(
        default=60.0, gt=0, description="a turn with no new token this long has stalled"
    )
    stream_interval: int = Field(
        default=16,
        ge=1,
        description="tokens per chunk a vLLM engine streams back for a client that does not "
        "stream (its first token at once); 1: every token",
    )
    health_interval_s: float = Field(default=2.0, gt=0, description="engine health-check period")
    health_failures: int = Field(
        default=2, ge=1, description="failed checks in a row before an engine is taken out"
    )
    idle_trajectory_s: float = Field(
        default=3600.0, gt=0, description="a trajectory idle this long without an end is ended"
    )
    refit_every: int = Field(
        default=256, ge=1, description="finished trajectories between predictor refits"
    )
    history_limit: int = Field(
        default=20_000, ge=1, description="finished trajectories the predictor learns from"
    )
    rose_cap_per_gpu: int = Field(
        default=16,
        ge=1,
        description="rose placement: turns an engine runs per GPU (ROSE App. A: rollout "
        "throughput saturates at 16)",
    )
    rose_lease_s: float = Field(
        default=10.0,
        ge=0,
        description="rose placement: a lent engine holds a trajectory's prefix this long "
        "after its turn ended (ROSE §4.1)",
    )
    max_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="a turn that has waited in the router this long (all its waits "
        "together) runs next, before every turn of its priority class that has not: the "
        "scheduler's order holds within this bound",
    )
    max_preemptions: int = Field(
        default=1, ge=0, description="times one turn may be preempted (0: never)"
    )
    move_kv: bool = Field(
        default=True,
        description="when the placement moves a trajectory between engines during its tool "
        "call, copy its KV cache to the new engine instead of prefilling it there again, "
        "where both engines can (Loom's emulated engines: Heddle §5.3)",
    )
    load_interval_s: float = Field(
        default=0.5, gt=0, description="how often the router asks each engine for its load"
    )
    kv_full: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="an engine that reports its KV cache this full takes no more turns than "
        "it runs until it reports less",
    )
    lent_stall_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="a turn on a lent engine with no new token this long has stalled (its "
        "serving traffic comes first, ROSE §4.1): it resumes elsewhere, the engine stays in",
    )
    fleet: FleetConfig | None = Field(
        default=None,
        description="engines the router starts itself in Heddle's planned layout, and stops "
        "when it stops",
    )

    def with_overrides(self, **values: Any) -> RolloutServerConfig:
        """A copy with the given fields replaced (None leaves a field as it is), validated."""
        return override(self, "rollout router", **values)


def load_config(path: Path) -> RolloutServerConfig:
    """Read a `.toml` or `.json` file into a validated config."""
    return load_settings(RolloutServerConfig, path, "rollout router")


# NOTE: a spec sets every engine setting but its url (the spec's head) and its token (a token
# on a command line shows in the process list: give it in the config file)
_NOT_IN_SPEC = ("url", "token")


def spec_options() -> tuple[str, ...]:
    """The options an engine spec takes: `EngineConfig`'s settings."""
    return tuple(name for name in EngineConfig.model_fields if name not in _NOT_IN_SPEC)


def engine_spec_syntax() -> str:
    """`URL[,tp=N]...`: the spec of one engine, with every option it takes."""
    return "URL" + "".join(f"[,{_option_syntax(name)}]" for name in spec_options())


def _option_syntax(name: str) -> str:
    kind = _plain(EngineConfig.model_fields[name].annotation)
    if kind is bool:
        return f"{name}[=true|false]"
    if isinstance(kind, type) and issubclass(kind, Enum):
        return f"{name}={'|'.join(member.value for member in kind)}"
    return f"{name}=N" if kind is int else f"{name}=NAME"


def _plain(annotation: Any) -> Any:
    """`X` of `X | None`."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if isinstance(annotation, UnionType) and len(args) == 1 else annotation


def parse_engine(spec: str, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """`URL[,tp=N][,max_running=N][,queue=N][,kind=K][,priority=false][,lent][,id=NAME][,node=N]
    [,version=N]` (`engine_spec_syntax()`) as the settings of one engine; `defaults` fill what
    the spec leaves out (None: the model's default). A true/false option alone means true."""
    url, *opts = (part.strip() for part in spec.split(","))
    out: dict[str, Any] = {k: v for k, v in (defaults or {}).items() if v is not None}
    out["url"] = url
    options = spec_options()
    for opt in opts:
        name, eq, value = opt.partition("=")
        name = name.strip().replace("-", "_")
        if name in options and eq:
            out[name] = value.strip()
        elif name in options and _plain(EngineConfig.model_fields[name].annotation) is bool:
            out[name] = True
        else:
            raise ConfigError(
                f"engine {spec!r}: unknown option {opt!r} (an engine is {engine_spec_syntax()})"
            )
    try:
        return EngineConfig.model_validate(out).model_dump()
    except ValidationError as exc:
        raise ConfigError(f"invalid engine {spec!r}: {'; '.join(describe(exc))}") from None
