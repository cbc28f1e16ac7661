"""What `loom run grpo CONFIG` runs: the jobs (a task and a seed each), the model, the services
they share (engines, router, cluster service, action server) and GRPO's settings. A TOML file;
every field has a default, so an empty file runs the example."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loom.cluster.plexrl.hrrs import OpPolicyKind
from loom.core.settings import load_settings
from loom.rl.grpo.tasks import TaskKind
from loom.rollout.policy import PlacementKind, SchedulerKind

__all__ = ["GRPOConfig", "JobSpec", "load_config"]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSpec(_Settings):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", description="the job's id")
    task: TaskKind = TaskKind.LOOKUP
    seed: int = Field(default=1, ge=0, description="its prompts, samples and task secret")


class ModelSettings(_Settings):
    dir: Path | None = Field(
        default=None,
        description="a Hugging Face model directory every job starts from (the engines serve "
        "it); default: Loom's tiny Qwen3, built with a narrow initialisation",
    )
    init_std: float = Field(default=0.02, gt=0, description="the tiny model's initialisation")


class GRPOSettings(_Settings):
    steps: int = Field(default=40, ge=1, le=100_000)
    samples: int = Field(default=16, ge=2, le=256, description="samples per prompt (a group)")
    lr: float = Field(default=3e-3, gt=0, le=1.0)
    clip: float = Field(default=0.2, gt=0, lt=1, description="PPO's ratio clip")
    minibatches: int = Field(
        default=1, ge=1, le=64, description="optimizer steps per batch (PPO epochs of one)"
    )
    max_grad_norm: float = Field(default=1.0, gt=0)
    temperature: float = Field(default=1.0, gt=0, le=10)
    warmup_steps: int = Field(
        default=30, ge=0, description="supervised steps on the task's format before GRPO"
    )
    warmup_batch: int = Field(default=32, ge=1)
    check_logprobs: bool = Field(
        default=True, description="each step, compare the engines' logprobs with the trainer's"
    )


class ServiceSettings(_Settings):
    engines: int = Field(default=1, ge=1, le=16, description="vLLM engines (one core each)")
    engine_cpus: tuple[str, ...] = Field(
        default=(), description="each engine's cores (default: the last cores, one each)"
    )
    max_running: int = Field(default=64, ge=1, description="requests an engine decodes at once")
    placement: PlacementKind = PlacementKind.HEDDLE
    scheduler: SchedulerKind = SchedulerKind.PPS
    cluster_policy: OpPolicyKind = OpPolicyKind.ROUND_ROBIN
    dp: int = Field(default=1, ge=1, le=8, description="data-parallel ranks of each job")
    sandbox: Literal["bwrap", "none"] = "bwrap"


class GRPOConfig(_Settings):
    seed: int = Field(default=1, ge=0)
    out: Path = Path("results/grpo")
    jobs: tuple[JobSpec, ...] = (
        JobSpec(name="a", seed=1),
        JobSpec(name="b", seed=2),
    )
    concurrent: bool = Field(
        default=True,
        description="jobs run at once, sharing the node group and the engines; false: one "
        "after the other",
    )
    model: ModelSettings = ModelSettings()
    grpo: GRPOSettings = GRPOSettings()
    services: ServiceSettings = ServiceSettings()

    @model_validator(mode="after")
    def _unique(self) -> GRPOConfig:
        names = [j.name for j in self.jobs]
        if not names:
            raise ValueError("jobs: at least one")
        if len(set(names)) != len(names):
            raise ValueError(f"jobs: names must differ, got {names}")
        if self.services.engine_cpus and len(self.services.engine_cpus) != self.services.engines:
            raise ValueError("services.engine_cpus: one entry per engine")
        return self


def load_config(path: Path) -> GRPOConfig:
    return load_settings(GRPOConfig, path, "grpo")
