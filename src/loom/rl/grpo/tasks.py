"""Tasks with a verifiable reward that a tiny model learns in minutes on two cores, over the
words of Loom's tiny tokenizer (one token each). The reward — and the tool, where the task has
one — is a Python script run in the action server's sandbox: it gets the samples as JSON on
its stdin and prints one result per sample. The task's secret lives in that script.

- `lookup` (one turn): the prompt is a digit word x; the answer, one word, earns 1 when it is
  the digit a secret permutation maps x to. Nothing in the prompt says which: the policy learns
  the table from the reward alone.
- `tool` (two turns where it calls the tool): the prompt is two digit words x, k; the answer
  earns 1 when it is their sum mod 10. The policy may answer at once, or call the tool (the
  word `fa`), which answers with the sum (`tool` then the digit), and answer after it.

The supervised warm-up (`warmup`) shows the format only: any digit after a prompt (and, for
`tool`, calls followed by the tool's digit repeated), never which digit earns the reward.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loom.core.errors import ConfigError

__all__ = ["Prompt", "Task", "TaskKind", "Vocab", "make_task"]

DIGIT_WORDS = ("ba", "be", "bi", "bo", "bu", "da", "de", "di", "do", "du")
CALL_WORD = "fa"


class TaskKind(StrEnum):
    LOOKUP = "lookup"
    TOOL = "tool"


@dataclass(frozen=True)
class Vocab:
    """The token ids a task uses, looked up in the model's tokenizer."""

    start: int  # <|im_start|>
    user: int
    tool: int
    call: int
    digits: tuple[int, ...]
    pad: int

    @classmethod
    def of(cls, tokenizer: Any) -> Vocab:
        def one(word: str) -> int:
            tid = tokenizer.convert_tokens_to_ids(word)
            if not isinstance(tid, int) or tid == tokenizer.unk_token_id:
                raise ConfigError(
                    f"the model's tokenizer has no single token for {word!r}: the GRPO tasks "
                    "are written over the words of Loom's tiny tokenizer"
                )
            return tid

        return cls(
            start=one("<|im_start|>"),
            user=one("user"),
            tool=one("tool"),
            call=one(CALL_WORD),
            digits=tuple(one(w) for w in DIGIT_WORDS),
            pad=int(tokenizer.pad_token_id or 0),
        )


@dataclass(frozen=True)
class Prompt:
    id: str
    ids: list[int]
    facts: dict[str, int]  # what the sandbox's scripts read


@dataclass
class Task:
    """A task's prompts, its format, and its sandboxed scripts."""

    kind: TaskKind
    vocab: Vocab
    seed: int
    secret: list[int] = field(default_factory=list)  # lookup: the digit permutation

    def __post_init__(self) -> None:
        perm = list(range(10))
        random.Random(f"lookup-secret-{self.seed}").shuffle(perm)
        self.secret = perm

    @property
    def turns(self) -> int:
        return 1 if self.kind is TaskKind.LOOKUP else 2

    def prompts(self, rng: random.Random) -> list[Prompt]:
        """One prompt per digit (every step sees each once)."""
        v, out = self.vocab, []
        for x in range(10):
            if self.kind is TaskKind.LOOKUP:
                out.append(Prompt(f"x{x}", [v.start, v.user, v.digits[x]], {"x": x}))
            else:
                k = rng.randrange(10)
                ids = [v.start, v.user, v.digits[x], v.digits[k]]
                out.append(Prompt(f"x{x}k{k}", ids, {"x": x, "k": k}))
        return out

    def tool_call(self, prompt: Prompt, turn: int, output: Sequence[int]) -> dict[str, int] | None:
        """What the tool is asked after `turn` produced `output`, or None: the answer is in."""
        if self.kind is TaskKind.TOOL and turn == 0 and list(output[:1]) == [self.vocab.call]:
            return dict(prompt.facts)
        return None

    def tool_tokens(self, result: int) -> list[int]:
        """What the tool's answer (a digit) appends to the context."""
        return [self.vocab.tool, self.vocab.digits[result]]

    def warmup(self, rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
        """`n` demonstrations of the format: (ids, mask over predicted tokens)."""
        v, rows = self.vocab, []
        for _ in range(n):
            prompt = rng.choice(self.prompts(rng))
            guess = v.digits[rng.randrange(10)]
            if self.kind is TaskKind.TOOL and rng.random() < 0.5:
                echo = v.digits[rng.randrange(10)]
                ids = [*prompt.ids, v.call, v.tool, echo, echo]
                mask = [0] * (len(prompt.ids) - 1) + [1, 0, 0, 1]
            else:
                ids = [*prompt.ids, guess]
                mask = [0] * (len(prompt.ids) - 1) + [1]
            rows.append((ids, mask))
        return rows

    # ---- the sandboxed scripts ------------------------------------------------------------

    @property
    def reward_code(self) -> str:
        """stdin: [{"facts": {...}, "answer": [ids]}, ...]; stdout: one reward each."""
        digits = list(self.vocab.digits)
        if self.kind is TaskKind.LOOKUP:
            want = f"DIGITS[{self.secret!r}[f['x']]]"
        else:
            want = "DIGITS[(f['x'] + f['k']) % 10]"
        return (
            "import json, sys\n"
            f"DIGITS = {digits!r}\n"
            "items = json.load(sys.stdin)\n"
            "out = []\n"
            "for it in items:\n"
            "    f = it['facts']\n"
            f"    out.append(1.0 if it['answer'] == [{want}] else 0.0)\n"
            "print(json.dumps(out))\n"
        )

    @property
    def tool_code(self) -> str | None:
        """stdin: [{"x": .., "k": ..}, ...]; stdout: the tool's answer (a digit) each."""
        if self.kind is TaskKind.LOOKUP:
            return None
        return (
            "import json, sys\n"
            "calls = json.load(sys.stdin)\n"
            "print(json.dumps([(c['x'] + c['k']) % 10 for c in calls]))\n"
        )


def make_task(kind: TaskKind, tokenizer: Any, seed: int) -> Task:
    return Task(TaskKind(kind), Vocab.of(tokenizer), seed)
