"""slime's own code against the router: `SGLangEngine.init` (registration),
`sglang_rollout.generate` (a rollout with `return_logprob`), `sglang_rollout.abort` (the
end-of-step abort loop, `abort_servers_until_idle` with `/v1/loads` since v0.3.1) and
`SGLangEngine.shutdown` (deregistration, then the engine is killed), imported from a slime
checkout and run over stand-in SGLang engines by `slime_driver.py`, which says what it stubs
(SGLang's launch, server args and process kill; the tokenizer; sglang_router's version).
slime's code is never part of this repository and CI cannot fetch it: the test skips unless
`LOOM_SLIME_SRC` names a checkout, e.g.

    git clone https://github.com/THUDM/slime /tmp/slime
    LOOM_SLIME_SRC=/tmp/slime python -m pytest tests/runtime/rollout/test_router_slime_code.py

An older slime (v0.2.x, v0.3.0) runs with `LOOM_SLIME_ROUTER_VERSION` set to the
sglang-router it expects (0.2.1: `/add_worker`, `/list_workers`, `/remove_worker`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SLIME = os.environ.get("LOOM_SLIME_SRC")

pytestmark = [
    # CI cannot fetch slime: it runs the replays of test_router_slime.py instead
    pytest.mark.may_skip_in_ci,
    pytest.mark.skipif(
        not SLIME,
        reason="slime's own code is not here: set LOOM_SLIME_SRC=/path/to/a/slime checkout "
        "(git clone https://github.com/THUDM/slime) to drive it against the router",
    ),
]


def test_slimes_own_functions_against_the_router(tmp_path: Path) -> None:
    assert SLIME is not None
    env = {**os.environ, "PYTHONPATH": SLIME, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("slime_driver.py"))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    report = json.loads(line[7:])
    first, *engines = report["registered"]
    assert engines == report["engine_urls"]  # each registered itself, under its own url
    assert first not in engines  # the router's own entry
    assert report["generate"] == {"status": "truncated", "tokens": 12, "exact": True}
    # the abort: all four end aborted with exactly what they generated; the two that waited
    # in the router never started; the router and the engines are idle afterwards
    aborted = report["aborted"]
    assert len(aborted) == 4 and all(s["status"] == "aborted" and s["exact"] for s in aborted)
    assert sum(s["tokens"] == 0 for s in aborted) >= 2
    assert sum(x["num_total_reqs"] for x in report["router_load_after_abort"]["loads"]) == 0
    assert report["engines_running_after_abort"] == [0, 0]
    assert report["stats_after_abort"]["aborted"] == 4
    # shutdown: slime found its engine, the turn it ran resumed on the other engine exactly,
    # and the engine was removed, not failed; the idle one went at once
    assert report["moved"] == {"status": "truncated", "tokens": 600, "exact": True}
    assert len(report["engines_after_shutdown"]) == 1
    after = report["stats_after_shutdown"]
    assert after["failovers"] == 0 and after["moved"] == 1 and after["removed"] == 1
    assert report["failed_turns"] == [0]
    assert report["workers_at_end"] == ["_router"]
    assert report["stats_at_end"]["removed"] == 2 and report["stats_at_end"]["failovers"] == 0
    assert report["slime_warnings"] == []  # no "not found in router", no failed abort
