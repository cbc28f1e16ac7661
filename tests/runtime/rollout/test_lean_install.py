"""Loom installed with no extras, as a GPU user installs it beside the vLLM they have: `loom
serve rollout` starts and routes without torch, vLLM, transformers, Ray, matplotlib or
scikit-learn, none of which it may import to serve (each is made to fail to import in the
router's process, as if it were not installed). `.ci/lean-install` does the same from a real
`pip install -e .` in an environment of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from loom.runtime.engine import free_port
from loom.runtime.rollout.standin import StandinProcess

HEAVY = ("torch", "vllm", "transformers", "ray", "matplotlib", "sklearn")

# the router's process: every heavy module fails to import, then the command line as typed
CHILD = f"""
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed here)")
        return None

sys.meta_path.insert(0, NotInstalled())
from loom.cli import app
app(sys.argv[1:], prog_name="loom")
"""


def test_the_router_serves_with_no_extra_installed() -> None:
    port = free_port()
    with StandinProcess("--step-ms", "1") as engine:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, "serve", "rollout", "--engine", engine.url,
             "--port", str(port), "--tokenizer", "engine"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, proc.communicate()[0]
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the router did not start"
                time.sleep(0.1)
            body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8}}
            out = httpx.post(url + "/generate", json=body, timeout=60)
            assert out.status_code == 200, out.text
            assert len(out.json()["output_ids"]) == 8
            text = httpx.post(
                url + "/v1/completions",
                json={"model": "standin", "prompt": "hello there", "max_tokens": 4},
                timeout=60,
            )
            assert text.status_code == 200, text.text  # a text prompt, tokenized by the engine
        finally:
            proc.send_signal(signal.SIGTERM)
            log = proc.communicate(timeout=60)[0]
        assert proc.returncode in (0, -signal.SIGTERM), log
        assert "not installed here" not in log, log
