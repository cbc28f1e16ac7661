"""The package's public names all load, and reading results loads no router or simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import loom.bench


def test_every_public_name_loads() -> None:
    for name in loom.bench.__all__:
        assert getattr(loom.bench, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = loom.bench.nothing  # type: ignore[attr-defined]


def test_reading_results_loads_neither_the_router_nor_the_simulator() -> None:
    code = (
        "import json, sys\n"
        "from loom.bench.results import read_results\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(out.stdout)
    heavy = ("loom.runtime", "loom.sim", "aiohttp", "sklearn", "matplotlib", "rich", "torch")
    assert not [m for m in loaded if m.split(".")[0] in heavy or m.startswith(heavy)]
