"""SandboxFusion's `POST /run_code` on the action server, so that code written for it (verl's
sandbox-fusion tool and reward functions among others) runs on Loom unchanged: the snippet
becomes a CPU action of a one-off trajectory, contained and scheduled like any other, whose
workspace holds the snippet, its stdin and the request's files (base64, as SandboxFusion
takes them), and is removed when the answer is ready."""

from __future__ import annotations

import base64
import binascii
import uuid
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from loom.core.actions import ActionStatus
from loom.core.errors import ConfigError
from loom.runtime.actions.driver import ActionDriver
from loom.runtime.actions.schemas import MAX_TIMEOUT_S, ActionRequest

__all__ = ["RunCodeRequest", "RunCodeResponse", "run_code"]


class Language(StrEnum):
    PYTHON = "python"
    BASH = "bash"


# language -> (file the snippet is written to, the command that runs it)
_RUNNERS: dict[Language, tuple[str, list[str]]] = {
    Language.PYTHON: ("main.py", ["python3", "main.py"]),
    Language.BASH: ("main.sh", ["bash", "main.sh"]),
}
_STDIN = ".stdin"


class RunCodeRequest(BaseModel):
    """SandboxFusion's request. `compile_timeout` is accepted and unused (nothing compiles);
    `memory_limit_MB` <= 0 means no limit of the action's own."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    code: str
    language: Language
    compile_timeout: float = Field(default=10.0, gt=0, le=MAX_TIMEOUT_S)
    run_timeout: float = Field(default=10.0, gt=0, le=MAX_TIMEOUT_S)
    memory_limit_MB: int = -1  # SandboxFusion's name
    stdin: str | None = None
    files: dict[Annotated[str, Field(min_length=1)], str] = Field(
        default_factory=dict, description="relative path -> base64 content"
    )
    fetch_files: list[str] = Field(default_factory=list, description="relative paths to return")


class RunStatus(StrEnum):
    FINISHED = "Finished"
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"
    ERROR = "Error"


class RunResult(BaseModel):
    status: RunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """`status`: Success (it ran and returned 0), Failed (it ran and did not), SandboxError
    (it could not be run: `message` says why)."""

    status: str
    message: str = ""
    compile_result: RunResult | None = None
    run_result: RunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def _relative(path: str) -> PurePosixPath:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ConfigError(f"file paths must be relative and stay in the workspace, got {path!r}")
    return p


def _write_inputs(req: RunCodeRequest, workspace: Path) -> None:
    name, _ = _RUNNERS[req.language]
    (workspace / name).write_text(req.code)
    (workspace / _STDIN).write_text(req.stdin or "")
    for path, content in req.files.items():
        target = workspace / _relative(path)
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"files[{path!r}] is not base64: {exc}") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


async def run_code(driver: ActionDriver, req: RunCodeRequest) -> RunCodeResponse:
    """Run the snippet as an action and answer in SandboxFusion's shape."""
    for path in req.fetch_files:
        _relative(path)
    trajectory = f"run-code-{uuid.uuid4().hex}"
    workspace = driver.workspaces.open(trajectory)
    try:
        _write_inputs(req, workspace)
        _, command = _RUNNERS[req.language]
        shell = 'exec "$@" < ' + _STDIN
        action = ActionRequest(
            trajectory_id=trajectory,
            command=["sh", "-c", shell, "sh", *command],
            timeout_s=req.run_timeout,
            memory_gb=req.memory_limit_MB / 1024 if req.memory_limit_MB > 0 else None,
        )
        rec = driver.submit(action)
        await rec.done.wait()
        out = rec.outcome
        assert out is not None
        files = {}
        for path in req.fetch_files:
            target = workspace / _relative(path)
            if target.is_file():
                files[path] = base64.b64encode(target.read_bytes()).decode()
    finally:
        await driver.end_trajectory(trajectory)
    if out.status is ActionStatus.CANCELLED or (out.exit_code is None and out.error):
        return RunCodeResponse(status="SandboxError", message=out.error or "not run")
    if out.status is ActionStatus.TIMED_OUT:
        run_status = RunStatus.TIME_LIMIT_EXCEEDED
    else:
        run_status = RunStatus.FINISHED
    result = RunResult(
        status=run_status,
        execution_time=rec.view(driver.clock).exec_s,
        return_code=out.exit_code,
        stdout=out.stdout,
        stderr=out.stderr,
    )
    ok = run_status is RunStatus.FINISHED and out.exit_code == 0
    return RunCodeResponse(
        status="Success" if ok else "Failed",
        message="" if ok else (out.error or ""),
        run_result=result,
        files=files,
    )
