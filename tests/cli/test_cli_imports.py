"""Reading a command line stays fast: `import loom.cli` (every command group) loads no heavy
library; each command imports what it needs when it runs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "vllm", "ray", "matplotlib", "sklearn", "transformers", "scipy", "pydantic")

PROBE = """
import json, sys
import loom.cli
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_the_cli_loads_no_heavy_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = set(json.loads(out.stdout))
    assert "loom.cli.serve.rollout" in loaded  # every command group was imported
    assert not [m for m in HEAVY if m in loaded]
