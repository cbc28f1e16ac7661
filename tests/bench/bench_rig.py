"""Helpers of the harness's tests: a tiny batch, and what a test left running."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from loom.bench.batch import Batch, BatchConfig, scaled_batch


def _process_tree() -> ModuleType:
    """`tests/runtime/process_tree.py`, which the runtime tests import by its name."""
    if "process_tree" in sys.modules:
        return sys.modules["process_tree"]
    path = Path(__file__).resolve().parents[1] / "runtime" / "process_tree.py"
    spec = importlib.util.spec_from_file_location("process_tree", path)
    assert spec is not None and spec.loader is not None, f"no {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules["process_tree"] = module
    spec.loader.exec_module(module)
    return module


process_tree = _process_tree()


def below_me() -> set[object]:
    """This process's live descendants."""
    return set(process_tree.descendants(os.getpid()))


def left_running(before: set[object], timeout_s: float = 30.0) -> dict[int, str]:
    """Descendants of this process started since `before` still alive after a generous wait
    (pid: command line); killed, so that one failure does not leak into the next test."""
    new = [p for p in process_tree.descendants(os.getpid()) if p not in before]
    left: dict[int, str] = process_tree.wait_gone(new, timeout_s)
    for p in new:
        p.kill()
    return left


def tiny_batch(**overrides: object) -> tuple[BatchConfig, Batch]:
    """A batch of four short trajectories with tool calls of a few milliseconds."""
    settings: dict[str, object] = {
        "prompts": 2,
        "samples": 2,
        "token_scale": 0.01,
        "tool_scale": 0.001,
        "max_turn_tokens": 24,
        "max_turns": 3,
        "history": 0,
    }
    config = BatchConfig(**(settings | overrides))  # type: ignore[arg-type]
    return config, scaled_batch(config)
