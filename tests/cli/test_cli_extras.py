"""A command that needs an extra which is not installed says so before it starts: the command,
the extra, the missing module and the line that installs it; no traceback."""

from __future__ import annotations

import importlib.util

import pytest
from cli_run import flat, run_without

from loom.core.extras import MODULES, Extra

# the extras each command checks, in the order it checks them
CHECKS = {
    "loom run grpo": (Extra.TORCH, Extra.CPU_ENGINE),
    "loom serve engine": (Extra.CPU_ENGINE,),
    "loom serve cluster": (Extra.TORCH,),
    "loom serve rollout --ray": (Extra.RAY,),
}


def checked_before(command: str, module: str) -> list[str]:
    """The modules `command` checks before `module`: the message names `module` only where
    all of them are installed."""
    order = [m for extra in CHECKS[command] for m in MODULES[extra]]
    return order[: order.index(module)]


@pytest.mark.parametrize(
    ("blocked", "args", "command", "extra", "module"),
    [
        ({"vllm"}, ["run", "grpo"], "loom run grpo", "cpu-engine", "vllm"),
        ({"transformers"}, ["run", "grpo"], "loom run grpo", "cpu-engine", "transformers"),
        ({"torch"}, ["run", "grpo"], "loom run grpo", "torch", "torch"),
        ({"vllm"}, ["serve", "engine"], "loom serve engine", "cpu-engine", "vllm"),
        ({"torch"}, ["serve", "cluster"], "loom serve cluster", "torch", "torch"),
        ({"ray"}, ["serve", "rollout", "--ray"], "loom serve rollout --ray", "ray", "ray"),
    ],
)
def test_a_missing_extra_names_itself_and_its_install_line(
    blocked: set[str], args: list[str], command: str, extra: str, module: str
) -> None:
    for before in checked_before(command, module):
        if importlib.util.find_spec(before) is None:
            pytest.skip(f"{command} would name {before} first: needs the extra that has it")
    out = run_without(blocked, *args)
    said = flat(out.stdout + out.stderr)
    assert out.returncode == 1, said
    assert f"{command} needs Loom's {extra!r} extra ({module} is not installed)" in said
    assert f"pip install -e '.[{extra}]'" in said
    assert "Traceback" not in said and "ModuleNotFoundError" not in said


def test_gpu_services_of_the_action_server_need_torch(tmp_path: pytest.TempPathFactory) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "actions.toml"
    path.write_text(
        'sandbox = "none"\n[[gpu_nodes]]\nmemory_gb = 0.001\n[[services]]\nname = "rm"\n'
    )
    out = run_without({"torch"}, "serve", "actions", "--config", str(path))
    said = flat(out.stdout + out.stderr)
    assert out.returncode == 1 and "needs Loom's 'torch' extra" in said, said
    assert "pip install -e '.[torch]'" in said
