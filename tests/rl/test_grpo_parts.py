"""The GRPO loop's pure parts: group-normalised advantages, and the tasks — their prompts, the
format their warm-up shows, and their sandboxed reward and tool scripts (run here as the
sandbox runs them: a fresh python3 with the samples on stdin)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loom.core.errors import ConfigError
from loom.rl.grpo.advantages import group_advantages
from loom.rl.grpo.config import GRPOConfig
from loom.rl.grpo.tasks import TaskKind, Vocab, make_task

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from loom.runtime.engine.model import TinyModelSpec, build_tiny_model

    pytest.importorskip("torch")
    return AutoTokenizer.from_pretrained(
        build_tiny_model(TinyModelSpec(init_std=0.02), tmp_path_factory.mktemp("m"))
    )


def run(code: str, items: list[Any]) -> list[Any]:
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(items), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    result: list[Any] = json.loads(out.stdout)
    return result


def test_advantages_are_normalised_within_each_group() -> None:
    adv = group_advantages([1, 0, 0, 0, 1, 1, 1, 1], ["p", "p", "p", "p", "q", "q", "q", "q"])
    assert adv[4:] == [0.0] * 4  # a group that earned alike teaches nothing
    assert adv[0] == pytest.approx(1.5, rel=1e-4) and adv[1] == pytest.approx(-0.5, rel=1e-4)
    assert sum(adv[:4]) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="3 rewards for 2"):
        group_advantages([1, 2, 3], ["a", "b"])


def test_lookup_rewards_only_the_secret_answer(tokenizer: Any) -> None:
    task = make_task(TaskKind.LOOKUP, tokenizer, seed=5)
    v = task.vocab
    prompts = task.prompts(random.Random(0))
    assert [p.facts["x"] for p in prompts] == list(range(10))
    right = [{"facts": p.facts, "answer": [v.digits[task.secret[p.facts["x"]]]]} for p in prompts]
    wrong = [{"facts": p.facts, "answer": [v.digits[(task.secret[p.facts["x"]] + 1) % 10]]}
             for p in prompts]  # fmt: skip
    assert run(task.reward_code, right + wrong) == [1.0] * 10 + [0.0] * 10
    assert make_task(TaskKind.LOOKUP, tokenizer, seed=6).secret != task.secret
    assert task.tool_code is None and task.turns == 1
    for ids, mask in task.warmup(random.Random(1), 20):
        assert len(mask) == len(ids) - 1 and sum(mask) == 1 and ids[-1] in v.digits


def test_the_tool_task_calls_its_tool_then_answers(tokenizer: Any) -> None:
    task = make_task(TaskKind.TOOL, tokenizer, seed=1)
    v = task.vocab
    (p, *_) = task.prompts(random.Random(0))
    assert task.tool_call(p, 0, [v.digits[3]]) is None  # an answer at once
    call = task.tool_call(p, 0, [v.call])
    assert call == p.facts and task.tool_call(p, 1, [v.call]) is None
    assert task.tool_code is not None
    (result,) = run(task.tool_code, [call])
    assert result == (p.facts["x"] + p.facts["k"]) % 10
    assert task.tool_tokens(result) == [v.tool, v.digits[result]]
    item = {"facts": p.facts, "answer": [v.digits[result]]}
    assert run(task.reward_code, [item, item | {"answer": [v.call]}]) == [1.0, 0.0]
    rows = task.warmup(random.Random(2), 50)
    calls = [(ids, m) for ids, m in rows if v.call in ids]
    assert calls and all(ids[-1] == ids[-2] and sum(m) == 2 for ids, m in calls)


def test_a_tokenizer_without_the_tasks_words_is_refused() -> None:
    class Plain:
        unk_token_id, pad_token_id = 0, 0

        def convert_tokens_to_ids(self, word: str) -> int:
            return 0

    with pytest.raises(ConfigError, match=re.escape("no single token for '<|im_start|>'")):
        Vocab.of(Plain())


def test_the_config_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="names must differ"):
        GRPOConfig.model_validate({"jobs": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(ValidationError, match="one entry per engine"):
        GRPOConfig.model_validate({"services": {"engines": 2, "engine_cpus": ["0"]}})
    with pytest.raises(ValidationError, match="task"):
        GRPOConfig.model_validate({"jobs": [{"name": "a", "task": "chess"}]})
    example = Path(__file__).resolve().parents[2] / "examples" / "grpo.toml"
    from loom.rl.grpo.config import load_config

    cfg = load_config(example)
    assert [j.name for j in cfg.jobs] == ["a", "b"] and cfg.concurrent
