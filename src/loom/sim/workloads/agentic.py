"""Agentic rollout workloads shaped like Heddle's characterization (§2.2, §7, Table 1).

A batch is `num_prompts` prompts × `samples` samples (GRPO groups of 16). Each prompt has a
latent difficulty; each sample a latent "luck" factor with large intra-group variance
(Heddle Fig. 5). Their product drives the number of steps and the tokens per step, so both
are long-tailed (Fig. 2). The first step's output (the plan) carries a noisy signal of the
sample's factor, which is why a predictor that sees the first steps beats a prompt-only one
(Fig. 13). Tool latencies are lognormal with the means of Table 1 per workload and model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loom.core.errors import ConfigError
from loom.core.rng import stream
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind

__all__ = ["PROFILES", "TOOL_LATENCY_S", "AgenticWorkload", "WorkloadProfile"]

# Mean tool execution time (s) per workload and model: Heddle Table 1.
TOOL_LATENCY_S: dict[WorkloadKind, dict[str, float]] = {
    WorkloadKind.CODING: {"qwen3-8b": 0.46, "qwen3-14b": 0.41, "qwen3-32b": 0.45},
    WorkloadKind.SEARCH: {"qwen3-8b": 1.42, "qwen3-14b": 1.41, "qwen3-32b": 1.43},
    WorkloadKind.MATH: {"qwen3-8b": 0.051, "qwen3-14b": 0.046, "qwen3-32b": 0.054},
}


@dataclass(frozen=True, kw_only=True)
class WorkloadProfile:
    """Shape parameters of one agentic domain (medians; spreads are lognormal sigmas)."""

    kind: WorkloadKind
    prompt_tokens: float  # median prompt length
    prompt_sigma: float
    difficulty_sigma: float  # spread of prompt difficulty (inter-group)
    sample_sigma: float  # spread of the per-sample factor (intra-group)
    extra_turns: float  # mean extra steps after the first at factor 1
    turn_exponent: float  # how strongly the factor raises the step count
    turn_tokens: float  # median output tokens of a non-plan step at factor 1
    token_exponent: float
    token_sigma: float
    plan_tokens: float  # median output tokens of the first (plan) step at factor 1
    plan_sigma: float  # noise of the plan's signal about the factor
    tool_output_tokens: float  # median tokens a tool returns into the context
    tool_output_sigma: float
    tool_sigma: float = 1.0  # lognormal sigma of tool latency (long-tailed, Fig. 2)
    max_turns: int = 48


# NOTE: the medians below are engineering choices that reproduce the qualitative shape the
# paper reports: coding and math decode-heavy with long tails; search with short steps, many
# interactions and large tool outputs (prefill-heavy, cache locality matters, §7.1).
PROFILES: dict[WorkloadKind, WorkloadProfile] = {
    WorkloadKind.CODING: WorkloadProfile(
        kind=WorkloadKind.CODING,
        prompt_tokens=700,
        prompt_sigma=0.4,
        difficulty_sigma=0.6,
        sample_sigma=0.7,
        extra_turns=2.5,
        turn_exponent=1.0,
        turn_tokens=900,
        token_exponent=0.5,
        token_sigma=0.6,
        plan_tokens=1500,
        plan_sigma=0.25,
        tool_output_tokens=350,
        tool_output_sigma=0.6,
    ),
    WorkloadKind.SEARCH: WorkloadProfile(
        kind=WorkloadKind.SEARCH,
        prompt_tokens=250,
        prompt_sigma=0.3,
        difficulty_sigma=0.5,
        sample_sigma=0.6,
        extra_turns=5.0,
        turn_exponent=1.0,
        turn_tokens=220,
        token_exponent=0.4,
        token_sigma=0.5,
        plan_tokens=400,
        plan_sigma=0.25,
        tool_output_tokens=900,
        tool_output_sigma=0.4,
    ),
    WorkloadKind.MATH: WorkloadProfile(
        kind=WorkloadKind.MATH,
        prompt_tokens=300,
        prompt_sigma=0.3,
        difficulty_sigma=0.6,
        sample_sigma=0.7,
        extra_turns=1.5,
        turn_exponent=1.0,
        turn_tokens=1800,
        token_exponent=0.6,
        token_sigma=0.6,
        plan_tokens=2500,
        plan_sigma=0.25,
        tool_output_tokens=60,
        tool_output_sigma=0.5,
    ),
}


@dataclass(frozen=True, kw_only=True)
class AgenticWorkload:
    """A fixed prompt set (drawn from `prompt_seed`) whose samples are redrawn per epoch."""

    kind: WorkloadKind
    model: str
    num_prompts: int
    samples: int = 16
    prompt_seed: int = 0
    max_output_tokens: int = 40_000

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.samples < 1:
            raise ConfigError("a workload needs at least one prompt and one sample per prompt")
        if self.max_output_tokens < 1:
            raise ConfigError("max_output_tokens must be >= 1")
        if self.model not in TOOL_LATENCY_S[WorkloadKind(self.kind)]:
            known = sorted(TOOL_LATENCY_S[WorkloadKind(self.kind)])
            raise ConfigError(f"no tool latency profile for model {self.model!r}; known: {known}")

    @property
    def profile(self) -> WorkloadProfile:
        return PROFILES[WorkloadKind(self.kind)]

    def prompts(self) -> tuple[np.ndarray, np.ndarray]:
        """(difficulty, prompt_tokens) per prompt — fixed by `prompt_seed`."""
        p = self.profile
        rng = stream(self.prompt_seed, f"prompts/{self.kind}")
        difficulty = rng.lognormal(0.0, p.difficulty_sigma, self.num_prompts)
        # Harder prompts tend to be longer: a weak, noisy link a prompt-only model can learn.
        tokens = (
            p.prompt_tokens * difficulty**0.3 * rng.lognormal(0, p.prompt_sigma, self.num_prompts)
        )
        return difficulty, np.maximum(16, tokens).astype(int)

    def sample(self, epoch: int) -> list[TrajectorySpec]:
        """All trajectories of one rollout batch; `epoch` selects the samples' random draw."""
        p = self.profile
        difficulty, prompt_tokens = self.prompts()
        text_rng = stream(self.prompt_seed, f"prompt-text/{self.kind}")
        # What a model reading the prompt text could infer about its difficulty (noisy).
        observed = difficulty * text_rng.lognormal(0.0, 0.5, self.num_prompts)
        rng = stream(self.prompt_seed * 1_000_003 + epoch, f"samples/{self.kind}")
        tool_mean = TOOL_LATENCY_S[WorkloadKind(self.kind)][self.model]
        tool_mu = math.log(tool_mean) - p.tool_sigma**2 / 2  # lognormal with that mean
        out: list[TrajectorySpec] = []
        for pid in range(self.num_prompts):
            for s in range(self.samples):
                factor = difficulty[pid] * rng.lognormal(0.0, p.sample_sigma)
                turns = self._turns(rng, p, factor, int(prompt_tokens[pid]), tool_mu)
                out.append(
                    TrajectorySpec(
                        traj_id=len(out),
                        prompt_id=pid,
                        sample_idx=s,
                        workload=WorkloadKind(self.kind),
                        turns=turns,
                        prompt_features=(float(prompt_tokens[pid]), float(observed[pid])),
                    )
                )
        return out

    def _turns(
        self,
        rng: np.random.Generator,
        p: WorkloadProfile,
        factor: float,
        prompt: int,
        tool_mu: float,
    ) -> tuple[TurnSpec, ...]:
        n_turns = 1 + int(rng.poisson(p.extra_turns * factor**p.turn_exponent))
        n_turns = min(n_turns, p.max_turns)
        outputs = [max(1, int(p.plan_tokens * factor**0.7 * rng.lognormal(0, p.plan_sigma)))]
        med = p.turn_tokens * factor**p.token_exponent
        outputs += [max(1, int(med * rng.lognormal(0, p.token_sigma))) for _ in range(n_turns - 1)]
        outputs = _cap(outputs, self.max_output_tokens)
        n = len(outputs)
        tool_out = rng.lognormal(math.log(p.tool_output_tokens), p.tool_output_sigma, n)
        tool_lat = rng.lognormal(tool_mu, p.tool_sigma, n)
        turns = []
        for i, o in enumerate(outputs):
            inp = prompt if i == 0 else max(1, int(tool_out[i - 1]))
            lat = None if i == n - 1 else float(tool_lat[i])
            turns.append(TurnSpec(input_tokens=inp, output_tokens=o, tool_latency_s=lat))
        return tuple(turns)


def _cap(outputs: list[int], limit: int) -> list[int]:
    """Truncate a trajectory at `limit` output tokens (the rollout's max response length)."""
    kept, total = [], 0
    for o in outputs:
        if total + o >= limit:
            kept.append(limit - total)
            break
        kept.append(o)
        total += o
    return [k for k in kept if k > 0] or [1]
