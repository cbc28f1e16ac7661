"""The action server's settings: where it listens, which cores it schedules, its API quotas,
its GPU nodes and services; loadable from a TOML or JSON file."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loom.actions.policy import ActionPolicyKind
from loom.core.settings import load_settings, override
from loom.runtime.access import Access

__all__ = [
    "ActionServerConfig",
    "ApiLimitConfig",
    "GpuNodeConfig",
    "GpuServiceConfig",
    "SandboxKind",
    "ServiceModelKind",
    "load_config",
]


# The policies the server can drive (the others model baselines of the paper's evaluation in
# the simulator: Kubernetes pods, ServerlessLLM, ...).
SERVER_POLICIES = (
    ActionPolicyKind.TANGRAM,
    ActionPolicyKind.TANGRAM_LOOKAHEAD,
    ActionPolicyKind.DOP4,
    ActionPolicyKind.DOP16,
)


Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ApiLimitConfig(_Settings):
    """One API quota: at most `concurrency` calls in flight and, when `quota` is set, at most
    `quota` calls started in each aligned window of `period_s` seconds."""

    name: Name = Field(description="quota name that API actions refer to")
    concurrency: int = Field(ge=1, description="calls in flight at once")
    quota: int | None = Field(default=None, ge=1, description="calls started per period")
    period_s: float = Field(default=60.0, gt=0, description="quota window, seconds")


class GpuNodeConfig(_Settings):
    """A GPU node as the GPU manager sees it; with CUDA its GPUs are the next `gpus` devices,
    without CUDA every GPU is the host CPU (the same logic on a slower device tier)."""

    name: Name = "gpu0"
    gpus: int = Field(default=1, ge=1, description="devices, a power of two")
    memory_gb: float = Field(gt=0, description="memory per device the services may fill")
    h2d_gbs: float = Field(default=25.0, gt=0, description="host-to-device GB/s (restore estimate)")
    restore_fixed_s: float = Field(default=0.01, ge=0, description="fixed restore cost estimate")


class ServiceModelKind(StrEnum):
    """Torch modules the server knows how to build (see `service_models`)."""

    MLP_REWARD = "mlp_reward"  # an MLP scoring input vectors: a stand-in reward model


class GpuServiceConfig(_Settings):
    """A named service: which module, its shape, its seed, and the degrees it may run at."""

    name: Name
    model: ServiceModelKind = ServiceModelKind.MLP_REWARD
    dim: int = Field(default=16, ge=1, le=65536, description="input vector length")
    hidden: int = Field(default=64, ge=1, le=65536, description="hidden width")
    layers: int = Field(default=2, ge=1, le=64, description="hidden layers")
    seed: int = Field(default=0, description="seed of the weights")
    working_gb: float = Field(default=0.0, ge=0, description="per-GPU working memory")
    dops: tuple[int, ...] = Field(default=(1,), min_length=1, description="degrees (powers of 2)")


class SandboxKind(StrEnum):
    """How CPU actions are isolated: bubblewrap namespaces, or not at all."""

    BWRAP = "bwrap"
    NONE = "none"


class ActionServerConfig(_Settings, Access):
    """Everything `loom serve actions` needs; every field has a default except services'
    device memory, so an empty file (or none) serves this machine's cores."""

    host: str = "127.0.0.1"
    port: int = Field(default=8077, ge=0, le=65535)
    workdir: Path | None = Field(
        default=None, description="trajectory workspaces; None: a temporary directory"
    )
    cores: tuple[int, ...] | None = Field(
        default=None, description="core ids to schedule; None: this process's allowed cores"
    )
    memory_gb: float | None = Field(
        default=None, gt=0, description="memory for environments; None: the machine's"
    )
    policy: ActionPolicyKind = ActionPolicyKind.TANGRAM
    backfill_s: float | None = Field(
        default=30.0,
        ge=0,
        description="an action that does not fit lets later ones that fit start, for this "
        "long (then it blocks them so it cannot starve); None: strict FCFS as in the paper",
    )
    default_timeout_s: float = Field(default=600.0, gt=0)
    max_output_bytes: int = Field(default=1 << 20, ge=1024, description="kept per stream (tail)")
    retain_max: int = Field(default=100_000, ge=1, description="finished actions remembered")
    retain_s: float = Field(
        default=3600.0, gt=0, le=30 * 86_400, description="how long a finished action is kept"
    )
    trajectory_idle_s: float = Field(
        default=3600.0,
        gt=0,
        le=30 * 86_400,
        description="a trajectory without actions this long is ended (its memory, workspace "
        "and records freed)",
    )
    max_body_bytes: int = Field(
        default=16 << 20, ge=1024, description="largest request body (413 beyond)"
    )
    sandbox: SandboxKind = Field(
        default=SandboxKind.BWRAP, description="isolate CPU actions with bubblewrap, or none"
    )
    sandbox_ro_binds: tuple[Path, ...] = Field(
        default=(),
        description="paths every sandboxed action sees read-only wherever they are, /tmp "
        "included (the server's interpreter and each command's executable are shown anyway); "
        "neither / nor /tmp itself: an action's /tmp stays its own",
    )
    network: bool = Field(
        default=True, description="actions may ask for the network; False refuses them"
    )
    cgroups: bool = Field(
        default=True, description="contain actions in cgroups where the machine allows it"
    )
    linger_s: float = Field(
        default=0.0, ge=0, le=3600, description="how long an action's leftovers may run on"
    )
    pids_max: int = Field(default=1024, ge=8, description="processes per action (pids.max)")
    api: tuple[ApiLimitConfig, ...] = ()
    gpu_nodes: tuple[GpuNodeConfig, ...] = ()
    services: tuple[GpuServiceConfig, ...] = ()

    @field_validator("policy", mode="before")
    @classmethod
    def _drivable(cls, policy: object) -> object:
        name = str(getattr(policy, "value", policy))
        if name in SERVER_POLICIES:
            return policy
        drivable = ", ".join(p.value for p in SERVER_POLICIES)
        if name in {p.value for p in ActionPolicyKind}:
            raise ValueError(f"{name!r} runs only in the simulator; the server drives {drivable}")
        others = ", ".join(p.value for p in ActionPolicyKind if p not in SERVER_POLICIES)
        raise ValueError(f"the server drives {drivable} ({others} run only in the simulator)")

    @model_validator(mode="after")
    def _unique_names(self) -> ActionServerConfig:
        for what, names in (
            ("API quota", [a.name for a in self.api]),
            ("GPU node", [n.name for n in self.gpu_nodes]),
            ("service", [s.name for s in self.services]),
        ):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"duplicate {what} names: {sorted(dup)}")
        for path in self.sandbox_ro_binds:
            if not path.is_absolute():
                raise ValueError(f"sandbox_ro_binds: {str(path)!r} is not an absolute path")
            if Path("/tmp").is_relative_to(path.resolve()):
                raise ValueError(
                    f"sandbox_ro_binds: {str(path)!r} would show the host's /tmp to every "
                    "action (an action's /tmp stays its own); list what it needs below /tmp"
                )
        if self.cores is not None and len(set(self.cores)) != len(self.cores):
            raise ValueError("cores lists a core twice")
        return self

    def with_overrides(self, **values: Any) -> ActionServerConfig:
        """A copy with the given fields replaced (None leaves a field as it is), validated."""
        return override(self, "action server", **values)


def load_config(path: Path) -> ActionServerConfig:
    """Read a `.toml` or `.json` file into a validated config."""
    return load_settings(ActionServerConfig, path, "action server")
