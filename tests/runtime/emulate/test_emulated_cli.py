"""`loom serve engine --emulate MODEL@GPU[:tpN]` as a user runs it: a process that prints its
URL, serves vLLM's routes, and stops on SIGTERM; a bad spec is refused by name."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from loom.runtime.engine import free_port


def test_loom_serve_engine_emulate_serves_and_stops_on_sigterm() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "loom.cli", "serve", "engine", "--emulate", "qwen3-8b@h200",
           "--time-scale", "0.05", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{port}"
        lines = []
        for line in proc.stdout:  # the URL is printed on a line of its own once it listens
            lines.append(line)
            if line.strip() == url:
                break
        else:
            pytest.fail(f"no URL printed: {''.join(lines)}")
        assert "qwen3-8b@h200:tp1" in "".join(lines)
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        assert models[0]["id"] == "qwen3-8b" and models[0]["root"] == "emulated:qwen3-8b@h200:tp1"
        body = {"prompt": list(range(5, 40)), "max_tokens": 64, "ignore_eos": True,
                "stream": True, "return_token_ids": True}  # fmt: skip
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
            text = "".join(resp.iter_text())
        assert '"finish_reason":"length"' in text and text.rstrip().endswith("data: [DONE]")
        assert "vllm:num_requests_running" in httpx.get(url + "/metrics", timeout=10).text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--emulate", "qwen3-14b@h999"], "unknown GPU type"),
        (["--emulate", "qwen3-14b"], "MODEL@GPU"),
        (["--emulate", "qwen3-14b@h100", "--time-scale", "0"], "time_scale"),
        (["--emulate", "qwen3-14b@h100", "--scheduling-policy", "lifo"], "lifo"),
        (["--emulate", "qwen3-14b@h100", "--host", "0.0.0.0"], "beyond loopback"),
        (["--emulate", "qwen3-14b@h100", "--token", "s3cret"], "16 characters or more"),
        (["--emulate", "qwen3-14b@h100", "--config", "x.json"], "not supported with --emulate"),
        (["--emulate", "qwen3-8b@h800", "--coserve", "nope"], "unknown model 'nope'"),
        (["--emulate", "qwen3-8b@h800", "--role", "prefill"], "it needs --coserve"),
        (["--emulate", "qwen3-8b@h800", "--coserve", "qwen2.5-7b", "--role", "x"], "'x'"),
    ],
)
def test_a_bad_emulation_is_refused_by_name(args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loom.cli", "serve", "engine", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in " ".join((out.stdout + out.stderr).split()), out.stderr
