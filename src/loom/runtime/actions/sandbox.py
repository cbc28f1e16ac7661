"""Isolation of CPU actions with bubblewrap (`bwrap`, Debian package `bubblewrap`): each action
runs in new PID, IPC, UTS and (unless it asks for the network) network namespaces, with the
system read-only, its trajectory's workspace the only writable path besides a private /tmp,
other workspaces hidden, and an environment of its own (`env` plus PATH, HOME and LANG)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loom.core.errors import ConfigError

__all__ = ["BWRAP_HINT", "Bubblewrap", "bubblewrap_missing", "minimal_env", "probe_bubblewrap"]

BWRAP_HINT = (
    "install bubblewrap (apt-get install bubblewrap) and allow it to create namespaces, "
    "or start the server with --sandbox none (no isolation)"
)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def minimal_env(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """What an action sees: a plain PATH, its workspace as HOME, a UTF-8 locale, then `env`."""
    return {"PATH": PATH, "HOME": str(home), "LANG": "C.UTF-8", **env}


@dataclass(frozen=True)
class Bubblewrap:
    """`argv(...)` wraps a command; `hide` are directories no action may see (the workspaces'
    root: an action sees its own workspace only)."""

    exe: str
    hide: tuple[Path, ...] = ()

    def argv(
        self,
        command: list[str],
        *,
        workspace: Path,
        env: Mapping[str, str],
        network: bool,
    ) -> list[str]:
        args = [
            self.exe,
            "--die-with-parent",  # the action dies with the process that waits on it
            "--new-session",  # no controlling terminal to push input into
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
        ]
        if not network:
            args.append("--unshare-net")
        args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for path in self.hide:
            args += ["--tmpfs", str(path)]
        ws = str(workspace)
        args += ["--bind", ws, ws, "--chdir", ws, "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        return [*args, "--", *command]


def bubblewrap_missing() -> str | None:
    """Why actions could not run under bubblewrap here (None: they can)."""
    try:
        probe_bubblewrap()
    except ConfigError as exc:
        return str(exc)
    return None


def probe_bubblewrap(hide: tuple[Path, ...] = ()) -> Bubblewrap:
    """A working bubblewrap, or a ConfigError that says why not and how to fix it."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise ConfigError(f"bubblewrap (bwrap) is not installed: {BWRAP_HINT}")
    box = Bubblewrap(exe, hide)
    probe = box.argv(["/bin/true"], workspace=Path("/tmp"), env={"PATH": PATH}, network=False)
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"bubblewrap cannot run ({exc}): {BWRAP_HINT}") from exc
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        raise ConfigError(f"bubblewrap cannot create its namespaces ({why}): {BWRAP_HINT}")
    return box
