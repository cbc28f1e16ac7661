"""Isolation of CPU actions with bubblewrap (`bwrap`, Debian package `bubblewrap`): each action
runs in new PID, IPC, UTS and (unless it asks for the network) network namespaces, with the
system read-only, its trajectory's workspace the only writable path besides a private /tmp,
other workspaces hidden, and an environment of its own (`env` plus PATH, HOME and LANG).

A private /tmp hides whatever lives under the host's /tmp, an interpreter or a virtual
environment included, so the sandbox binds back, read-only, what a command needs to start:
the server's interpreter (its prefixes: a virtual environment and its base), the command's
executable with the tree it comes in (a `bin` directory's parent: its prefix), every symlink
on the way and what it resolves to, a virtual environment's base and a script's interpreter,
and the paths the server's configuration lists (`sandbox_ro_binds`). Nothing else of /tmp is
seen, and nothing under the workspaces' root but the action's own workspace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loom.core.errors import ConfigError

__all__ = [
    "BWRAP_HINT",
    "Bubblewrap",
    "bubblewrap_missing",
    "interpreter_paths",
    "minimal_env",
    "probe_bubblewrap",
    "program_paths",
]

BWRAP_HINT = (
    "install bubblewrap (apt-get install bubblewrap) and allow it to create namespaces, "
    "or start the server with --sandbox none (no isolation)"
)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PRIVATE_TMP = Path("/tmp")
_MAX_HOPS = 40  # symlinks followed, as the kernel's limit


def minimal_env(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """What an action sees: a plain PATH, its workspace as HOME, a UTF-8 locale, then `env`."""
    return {"PATH": PATH, "HOME": str(home), "LANG": "C.UTF-8", **env}


# -- what a program needs to start -----------------------------------------------------------


def _hops(path: Path) -> list[Path]:
    """`path`, each symlink target it leads through, and the file it resolves to."""
    hops = [path]
    current = path
    for _ in range(_MAX_HOPS):
        if not current.is_symlink():
            break
        target = Path(os.readlink(current))
        current = Path(os.path.normpath(current.parent / target))
        if current in hops:
            break
        hops.append(current)
    real = path.resolve()
    return hops if real in hops else [*hops, real]


def _prefix(path: Path) -> Path:
    """The tree a program comes in: the parent of its `bin` directory (an interpreter's or a
    virtual environment's prefix, with its libraries), else its own directory."""
    parent = path.parent
    return parent.parent if parent.name in ("bin", "sbin") else parent


def _venv_base(prefix: Path) -> Path | None:
    """The base interpreter's prefix of the virtual environment at `prefix` (its pyvenv.cfg's
    `home`), or None when `prefix` is none."""
    try:
        lines = (prefix / "pyvenv.cfg").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home":
            return _prefix(Path(value.strip()) / "python")
    return None


def _interpreter(script: Path, env_path: str | None) -> Path | None:
    """The interpreter of a `#!` script (through `env`, looked up on `env_path`)."""
    try:
        with script.open("rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(names[0], path=env_path) if names else None
        return Path(found) if found else None
    return Path(words[0])


def program_paths(program: Path, env_path: str | None = None, *, _depth: int = 0) -> list[Path]:
    """What running `program` (an absolute path) needs to see: the prefix of its path and of
    every symlink hop, a virtual environment's base, and a script's interpreter, the same way.
    The file itself is included, for a program whose prefix cannot be bound (see
    `Bubblewrap`)."""
    paths: list[Path] = []
    for hop in _hops(program):
        paths += [hop, hop.parent, _prefix(hop)]
        if (base := _venv_base(_prefix(hop))) is not None:
            paths.append(base)
    interpreter = _interpreter(program, env_path)
    if interpreter is not None and interpreter.is_absolute() and _depth < 2:
        paths += program_paths(interpreter, env_path, _depth=_depth + 1)
    return list(dict.fromkeys(paths))


def interpreter_paths() -> list[Path]:
    """What this server's Python needs to start: its executable and prefixes (a virtual
    environment's and its base's), as given and resolved."""
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    paths = [Path(p) for p in prefixes]
    if sys.executable:
        paths += program_paths(Path(sys.executable))
    return list(dict.fromkeys(paths))


# -- the sandbox -----------------------------------------------------------------------------


def _within(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


@dataclass(frozen=True)
class Bubblewrap:
    """`argv(...)` wraps a command; `hide` are directories no action may see (the workspaces'
    root: an action sees its own workspace only); `binds` are paths every action sees (read
    only) wherever they are, /tmp included: the server's interpreter and configured paths.
    A path the sandbox shows anyway (outside /tmp and `hide`) needs no bind; one under `hide`
    is never shown."""

    exe: str
    hide: tuple[Path, ...] = ()
    binds: tuple[Path, ...] = ()
    _fixed: tuple[tuple[Path, Path], ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        fixed = self._ordered(self._bind_pairs(self.binds, needed=True))
        object.__setattr__(self, "_fixed", tuple(fixed))

    def _bind_pairs(self, paths: Iterable[Path], *, needed: bool) -> list[tuple[Path, Path]]:
        """(source, destination) of the read-only binds that show `paths` (absolute) as they
        are on the host: each resolved at its own place and, when named through a symlink,
        at the place it is named by too. /tmp itself (or a directory above it) is never
        bound, nor anything under `hide`. With `needed` (a configured bind) a path that cannot
        be shown is an error; else it is left out."""
        pairs: dict[Path, Path] = {}
        for path in paths:
            if needed and not path.exists():
                raise ConfigError(f"cannot show {path} in the sandbox: it does not exist")
            real = path.resolve()
            for dest in dict.fromkeys((path, real)):
                if _within(dest, self.hide) or _within(PRIVATE_TMP, (dest,)):
                    if needed:
                        why = (
                            "it is in the workspaces' directory, which no action may see"
                            if _within(dest, self.hide)
                            else "an action's /tmp stays its own"
                        )
                        raise ConfigError(f"cannot show {dest} in the sandbox: {why}")
                    continue
                if _within(dest, (PRIVATE_TMP,)) and real.exists():
                    pairs[dest] = real  # elsewhere the sandbox shows the host's as it is
        return [(src, dest) for dest, src in pairs.items()]

    @staticmethod
    def _ordered(pairs: Iterable[tuple[Path, Path]]) -> list[tuple[Path, Path]]:
        """Parents first (a bind covers what was bound below it before), without those that
        an identity bind of a directory above them shows already."""
        unique = sorted(dict.fromkeys(pairs), key=lambda pair: (len(pair[1].parts), pair[1]))
        kept: list[tuple[Path, Path]] = []
        for src, dest in unique:
            if not any(s == d and dest != d and dest.is_relative_to(d) for s, d in kept):
                kept.append((src, dest))
        return kept

    def argv(
        self,
        command: list[str],
        *,
        workspace: Path,
        env: Mapping[str, str],
        network: bool,
        reveal: Sequence[Path] = (),
    ) -> list[str]:
        """The bwrap command line running `command`; `reveal`: paths this command needs
        (`program_paths` of its executable), shown where the sandbox would hide them."""
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
        binds = self._fixed
        if reveal:
            binds = tuple(self._ordered([*binds, *self._bind_pairs(reveal, needed=False)]))
        for src, dest in binds:
            args += ["--ro-bind", str(src), str(dest)]
        for path in self.hide:  # after the binds: a bind that holds the workspaces hides them
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


def probe_bubblewrap(hide: tuple[Path, ...] = (), binds: Sequence[Path] = ()) -> Bubblewrap:
    """A working bubblewrap that shows this server's interpreter and `binds` to every action,
    or a ConfigError that says why not and how to fix it (a bind that cannot be shown)."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise ConfigError(f"bubblewrap (bwrap) is not installed: {BWRAP_HINT}")
    box = Bubblewrap(exe, hide, (*_showable(interpreter_paths(), hide), *binds))
    probe = box.argv(["/bin/true"], workspace=Path("/tmp"), env={"PATH": PATH}, network=False)
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"bubblewrap cannot run ({exc}): {BWRAP_HINT}") from exc
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        raise ConfigError(f"bubblewrap cannot create its namespaces ({why}): {BWRAP_HINT}")
    return box


def _showable(paths: Iterable[Path], hide: tuple[Path, ...]) -> list[Path]:
    """`paths` but those a sandbox may not show (the interpreter's own are shown where they
    can be: a Python living in /tmp itself or in the workspaces runs unsandboxed only)."""
    box = Bubblewrap("bwrap", hide)
    return [p for p in paths if box._bind_pairs([p], needed=False)]
