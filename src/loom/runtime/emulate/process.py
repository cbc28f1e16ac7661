"""An emulated engine in a process of its own (tethered to its starter), and its command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import fields

from loom.core.errors import ConfigError
from loom.proc.tether import Tethered
from loom.rollout.engine_queue import EngineSchedulingPolicy
from loom.rollout.rose.admission import Role
from loom.runtime.access import is_loopback
from loom.runtime.emulate.config import CoServeSettings, EmulatedEngineConfig, EmulationSpec

__all__ = ["EmulatedProcess", "main"]


class EmulatedProcess:
    """`python -m loom.runtime.emulate SPEC --port 0 *args` on a free loopback port; a context
    manager. Its URL is `url`."""

    def __init__(self, spec: str, *args: str) -> None:
        # NOTE: stderr goes to a file, not a pipe: a pipe nobody reads fills (64 KiB of
        # warnings) and then blocks the engine
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        try:
            self.proc = Tethered(
                [sys.executable, "-m", "loom.runtime.emulate", spec, "--port", "0", *args],
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
            )
        except BaseException:
            self._stderr.close()
            raise
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # printed once it listens
        match = re.search(r"http://\S+", line)
        if match is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # it may still run: it said no URL
            self.proc.wait(10)
            self._stderr.seek(0)
            err = self._stderr.read().decode(errors="replace")
            self.stop()
            raise RuntimeError(f"the emulated engine did not start: {line!r} {err[-2000:]}")
        self.url = match.group(0)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the engine and its tether
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> EmulatedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _help(name: str) -> str:
    return next(f.metadata.get("help", "") for f in fields(EmulatedEngineConfig) if f.name == name)


def main(argv: list[str] | None = None) -> None:
    from loom.runtime.emulate.server import serve

    p = argparse.ArgumentParser(prog="python -m loom.runtime.emulate")
    p.add_argument("spec", help="MODEL@GPU[:tpN], e.g. qwen3-14b@h100:tp2")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=1.0, help=_help("time_scale"))
    p.add_argument(
        "--scheduling-policy",
        default="priority",
        choices=[k.value for k in EngineSchedulingPolicy],
        help=_help("scheduling_policy"),
    )
    p.add_argument("--max-running", type=int, default=None, help=_help("max_running"))
    p.add_argument("--chunk-tokens", type=int, default=None, help=_help("chunk_tokens"))
    p.add_argument("--decode-reserve", type=int, default=None, help=_help("decode_reserve"))
    p.add_argument("--max-model-len", type=int, default=None, help=_help("max_model_len"))
    p.add_argument("--served-model-name", default=None, help=_help("served_model_name"))
    p.add_argument("--node", type=int, default=None, help=_help("node"))
    p.add_argument(
        "--stream-interval-ms", type=float, default=50.0, help=_help("stream_interval_s")
    )
    p.add_argument("--coserve", default=None, metavar="SERVING_MODEL", help=_help("coserve"))
    p.add_argument("--role", default="decode", choices=["prefill", "decode"], help=_ROLE)
    p.add_argument("--token", default=None, help=_help("token"))
    args = p.parse_args(argv)
    token = args.token
    if token is None and not is_loopback(args.host):
        p.error(f"binding {args.host} (beyond loopback) without a token: give --token")
    try:
        config = make_config(
            args.spec,
            time_scale=args.time_scale,
            scheduling_policy=args.scheduling_policy,
            max_running=args.max_running,
            chunk_tokens=args.chunk_tokens,
            decode_reserve=args.decode_reserve,
            max_model_len=args.max_model_len,
            served_model_name=args.served_model_name,
            node=args.node,
            stream_interval_s=args.stream_interval_ms / 1000,
            coserve=coserve(args.coserve, args.role),
            token=token,
        )
    except ConfigError as exc:
        p.error(str(exc))
    serve(config, args.host, args.port, lambda url: print(f"emulated engine on {url}", flush=True))


_ROLE = "with --coserve: the instance's serving role, prefill or decode (PD disaggregation)"


def coserve(serving_model: str | None, role: str = "decode") -> CoServeSettings | None:
    """A lent GPU's settings for `--coserve SERVING_MODEL --role ROLE` (None: a rollout
    engine)."""
    if serving_model is None:
        return None
    if role not in (Role.PREFILL.value, Role.DECODE.value):
        raise ConfigError(f"role must be prefill or decode, got {role!r}")
    return CoServeSettings(serving_model=serving_model.lower(), role=Role(role))


def make_config(spec: str, **values: object) -> EmulatedEngineConfig:
    """A config from `MODEL@GPU[:tpN]` and settings; None values keep the defaults."""
    given = {k: v for k, v in values.items() if v is not None}
    if "scheduling_policy" in given:
        given["scheduling_policy"] = EngineSchedulingPolicy(str(given["scheduling_policy"]))
    return EmulatedEngineConfig(spec=EmulationSpec.parse(spec), **given)  # type: ignore[arg-type]
