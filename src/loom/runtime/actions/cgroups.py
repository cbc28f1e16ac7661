"""Kernel containment of CPU actions: a cgroup per action (cpuset = exactly its granted cores,
`pids.max`, kill-all through the freezer on cgroup v1 or `cgroup.kill` on v2) inside a memory
group per trajectory (its `memory_gb` over all its processes).

Groups live below the server's own cgroup in each hierarchy (so the limits of whatever runs
the server still hold), under a root named for this server instance: `loom-<pid>-<start>-<n>`,
the process id, its start time in clock ticks (`/proc/<pid>/stat`: no other process shares
both) and the server's number within the process. When a server dies, its reaper
(`loom.runtime.reaper`) removes its root, killing what runs in it; a server that starts also
removes the roots of instances that are gone (a server killed together with its reaper leaves
its groups and their processes behind), killing what runs in them."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from loom.core.errors import LoomError

__all__ = [
    "ActionGroup",
    "CgroupError",
    "Cgroups",
    "cgroups_missing",
    "probe_cgroups",
    "remove_root",
]

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("cpuset", "memory", "pids", "freezer")
V2_CONTROLLERS = ("cpuset", "memory", "pids")
_ROOT = re.compile(r"^loom-(\d+)-(\d+)-(\d+)$")
_instances = itertools.count()  # servers (drivers) of this process
_EMPTY_WAIT_S = 5.0  # how long a killed group may take to empty before rmdir gives up


class CgroupError(LoomError, RuntimeError):
    """A cgroup could not be created, configured or joined."""


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name may hold spaces


def instance_name() -> str:
    """`loom-<pid>-<start ticks>-<n>`: the n-th server of this process."""
    pid = os.getpid()
    ticks = _start_ticks(pid)
    assert ticks is not None, f"process {pid} has no /proc entry"
    return f"loom-{pid}-{ticks}-{next(_instances)}"


def _alive(name: str) -> bool:
    m = _ROOT.match(name)
    assert m is not None
    return _start_ticks(int(m.group(1))) == int(m.group(2))


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from exc


def _procs(group: Path) -> list[int]:
    """Every process of `group` and of the groups below it."""
    pids: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for dirpath, _, _ in os.walk(group):
            with contextlib.suppress(FileNotFoundError):
                pids += [int(p) for p in (Path(dirpath) / "cgroup.procs").read_text().split()]
    return pids


def _rmdir_tree(group: Path) -> bool:
    """Remove `group` and the groups below it, deepest first; False if one is still busy."""
    if not group.exists():
        return True
    ok = True
    for dirpath, _, _ in sorted(os.walk(group), key=lambda w: -len(w[0])):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            ok = False
    return ok


def _kill_procs(groups: list[Path], freezers: list[Path]) -> None:
    """SIGKILL every process in `groups` (and below). Freezing first (v1) stops a process
    from forking past the kill: a frozen group's members cannot run until they are thawed,
    and a SIGKILL takes them as they thaw."""
    pids = _all_procs(groups)
    if not pids:  # the common case, an action whose processes all exited: nothing to freeze
        return
    for f in freezers:
        with contextlib.suppress(OSError):
            f.joinpath("freezer.state").write_text("FROZEN")
    deadline = time.monotonic() + _EMPTY_WAIT_S
    while pids and time.monotonic() <= deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for f in freezers:
            with contextlib.suppress(OSError):
                f.joinpath("freezer.state").write_text("THAWED")
        time.sleep(0.005)
        pids = _all_procs(groups)


def _all_procs(groups: list[Path]) -> set[int]:
    return {p for g in groups for p in _procs(g)}


def remove_root(version: int, bases: dict[str, Path], root: str) -> None:
    """Kill every process of the server instance `root` and remove its groups (in each of
    `bases`, the server's own cgroup per hierarchy)."""
    ctls = V1_CONTROLLERS if version == 1 else ("unified",)
    tops = [Path(bases[ctl]) / root for ctl in ctls]
    freezers = [Path(bases["freezer"]) / root] if version == 1 else []
    if version == 2:
        for top in tops:
            with contextlib.suppress(OSError):
                top.joinpath("cgroup.kill").write_text("1")
    _kill_procs(tops, [f for f in freezers if f.exists()])
    deadline = time.monotonic() + _EMPTY_WAIT_S
    while not all(_rmdir_tree(t) for t in tops):
        if time.monotonic() > deadline:
            log.warning("cgroups of %s did not empty; left in place", root)
            return
        time.sleep(0.005)


@dataclass
class ActionGroup:
    """The groups one action's processes join: `procs_files` are the `cgroup.procs` files a
    new process writes itself into (one per v1 hierarchy; one on v2)."""

    version: int
    procs_files: tuple[Path, ...]
    own: tuple[Path, ...]  # the action's own groups (removed when it ends)
    freezer: Path | None = None  # v1

    def pids(self) -> list[int]:
        return sorted({p for g in self.own for p in _procs(g)})

    def kill(self) -> None:
        """Kill every process of the action, double-forked and `setsid` ones included."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                self.own[0].joinpath("cgroup.kill").write_text("1")
        _kill_procs(list(self.own), [self.freezer] if self.freezer is not None else [])

    def remove(self) -> None:
        """Kill what is left and remove the action's groups."""
        self.kill()
        deadline = time.monotonic() + _EMPTY_WAIT_S
        while not all(_rmdir_tree(g) for g in self.own):
            if time.monotonic() > deadline:
                log.warning("cgroups %s did not empty; left in place", list(map(str, self.own)))
                return
            time.sleep(0.005)


@dataclass
class Cgroups:
    """This server instance's groups: `bases` are the server's own cgroup in each hierarchy
    (v1: one per controller; v2: one), `root` the instance's directory name below each."""

    version: int
    bases: dict[str, Path]
    root: str = field(default_factory=instance_name)
    pids_max: int = 1024
    _mems: str = "0"
    _limits: dict[str, int | None] = field(default_factory=dict)  # trajectory -> memory limit

    def __post_init__(self) -> None:
        self.reap_stale()
        for ctl in self._hierarchies():
            top = self.bases[ctl] / self.root
            top.mkdir(exist_ok=True)
        if self.version == 1:
            cpuset = self.bases["cpuset"]
            self._mems = (cpuset / "cpuset.mems").read_text().strip()
            top = cpuset / self.root
            _write(top / "cpuset.cpus", (cpuset / "cpuset.cpus").read_text().strip())
            _write(top / "cpuset.mems", self._mems)
        else:
            self._enable(self.bases["unified"] / self.root)

    # hierarchy layout -------------------------------------------------------------------

    def _hierarchies(self) -> tuple[str, ...]:
        return V1_CONTROLLERS if self.version == 1 else ("unified",)

    def _top(self, ctl: str) -> Path:
        return self.bases[ctl] / self.root

    @staticmethod
    def _enable(group: Path) -> None:
        _write(group / "cgroup.subtree_control", " ".join(f"+{c}" for c in V2_CONTROLLERS))

    def _trajectory_dir(self, trajectory_id: str) -> Path:
        ctl = "memory" if self.version == 1 else "unified"
        return self._top(ctl) / f"t-{trajectory_id}"

    # trajectories and actions ---------------------------------------------------------------

    def trajectory(self, trajectory_id: str, memory_bytes: int | None) -> None:
        """Create (or update) the trajectory's memory group; `None`: no limit of its own.
        Its limit is written only when it changes (this runs before every action)."""
        group = self._trajectory_dir(trajectory_id)
        if trajectory_id not in self._limits:
            group.mkdir(exist_ok=True)
            if self.version == 2:
                self._enable(group)
            self._limits[trajectory_id] = None
        if memory_bytes is None or self._limits[trajectory_id] == memory_bytes:
            return
        if self.version == 1:
            # memory+swap may never be below memory: a raise writes memsw first, a cut (the
            # first limit cuts from unlimited) writes it last
            previous = self._limits[trajectory_id]
            files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            if previous is not None and memory_bytes > previous:
                files.reverse()
            for name in files:
                if name == "memory.memsw.limit_in_bytes":
                    with contextlib.suppress(CgroupError, FileNotFoundError):  # no swap accounting
                        _write(group / name, str(memory_bytes))
                else:
                    _write(group / name, str(memory_bytes))
        else:
            _write(group / "memory.max", str(memory_bytes))
            with contextlib.suppress(CgroupError, FileNotFoundError):
                _write(group / "memory.swap.max", "0")
        self._limits[trajectory_id] = memory_bytes

    def action(
        self, trajectory_id: str, action_id: str, cores: tuple[int, ...], memory_bytes: int | None
    ) -> ActionGroup:
        """The groups for one action on `cores`, inside its trajectory's memory group."""
        self.trajectory(trajectory_id, memory_bytes)
        cpus = ",".join(map(str, sorted(cores)))
        name = f"a-{action_id}"
        if self.version == 2:
            group = self._trajectory_dir(trajectory_id) / name
            group.mkdir()
            _write(group / "cpuset.cpus", cpus)
            _write(group / "pids.max", str(self.pids_max))
            return ActionGroup(2, (group / "cgroup.procs",), (group,))
        own = {ctl: self._top(ctl) / name for ctl in ("cpuset", "pids", "freezer")}
        for g in own.values():
            g.mkdir()
        _write(own["cpuset"] / "cpuset.cpus", cpus)
        _write(own["cpuset"] / "cpuset.mems", self._mems)
        _write(own["pids"] / "pids.max", str(self.pids_max))
        memory = self._trajectory_dir(trajectory_id)
        files = tuple(g / "cgroup.procs" for g in (*own.values(), memory))
        return ActionGroup(1, files, tuple(own.values()), freezer=own["freezer"])

    def end_trajectory(self, trajectory_id: str) -> None:
        """Kill whatever still runs in the trajectory's groups and remove them."""
        self._limits.pop(trajectory_id, None)
        group = self._trajectory_dir(trajectory_id)
        _kill_procs([group], [])
        with contextlib.suppress(OSError):
            _rmdir_tree(group)

    def close(self) -> None:
        """Kill every process of this instance and remove its groups."""
        self._remove_root(self.root)

    # stale instances ---------------------------------------------------------------------

    def _remove_root(self, root: str) -> None:
        remove_root(self.version, self.bases, root)

    def spec(self) -> dict[str, object]:
        """What `remove_root` needs to remove this instance from another process (JSON)."""
        bases = {ctl: str(path) for ctl, path in self.bases.items()}
        return {"version": self.version, "bases": bases, "root": self.root}

    def stale_roots(self) -> list[str]:
        """Roots of server instances that are gone, in any of this server's hierarchies."""
        names: set[str] = set()
        for ctl in self._hierarchies():
            with contextlib.suppress(FileNotFoundError):
                names |= {p.name for p in self.bases[ctl].iterdir() if _ROOT.match(p.name)}
        return sorted(n for n in names if n != self.root and not _alive(n))

    def reap_stale(self) -> list[str]:
        stale = self.stale_roots()
        for root in stale:
            pids = {p for ctl in self._hierarchies() for p in _procs(self.bases[ctl] / root)}
            log.warning(
                "removing the cgroups of a server that is gone (%s), killing %d processes",
                root,
                len(pids),
            )
            self._remove_root(root)
        return stale


# discovery ----------------------------------------------------------------------------------


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """The server's cgroup path per v1 controller, and under "" its v2 path."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctls, path = line.split(":", 2)
        for ctl in ctls.split(",") if ctls else [""]:
            paths[ctl] = path
    return paths


def _v1_bases() -> tuple[dict[str, Path] | None, str]:
    mounts = {
        ctl: point
        for point, fs, opts in _mounts()
        if fs == "cgroup"
        for ctl in opts & set(V1_CONTROLLERS)
    }
    missing = [c for c in V1_CONTROLLERS if c not in mounts]
    if missing:
        return None, f"cgroup v1 lacks the {', '.join(missing)} controller(s)"
    own = _own_paths()
    bases = {c: Path(mounts[c]) / own.get(c, "/").lstrip("/") for c in V1_CONTROLLERS}
    return bases, ""


def _v2_base() -> tuple[Path | None, str]:
    points = [point for point, fs, _ in _mounts() if fs == "cgroup2"]
    if not points:
        return None, "no cgroup2 mount"
    base = Path(points[0]) / _own_paths().get("", "/").lstrip("/")
    available = set((base / "cgroup.controllers").read_text().split())
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        return None, f"cgroup v2 at {base} does not offer {', '.join(missing)}"
    # The instance's groups below `base` see only the controllers `base` delegates. v2 lets a
    # group delegate only while no process sits in it (the root excepted), so a server that
    # shares its cgroup with others (a login shell, a service's main process) cannot.
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    need = [c for c in V2_CONTROLLERS if c not in enabled]
    if need:
        try:
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in need))
        except CgroupError as exc:
            return None, (
                f"cgroup v2: cannot delegate {', '.join(need)} below {base} ({exc}); run the "
                "server in a cgroup of its own with them delegated, e.g. `systemd-run --scope "
                "-p Delegate=yes loom serve actions ...`"
            )
    return base, ""


def cgroups_missing() -> str | None:
    """Why this process could not contain actions in cgroups (None: it can): the probe makes
    and removes a group wherever the server would."""
    cgroups, why = probe_cgroups()
    if cgroups is None:
        return why
    cgroups.close()
    return None


def probe_cgroups(pids_max: int = 1024) -> tuple[Cgroups | None, str]:
    """This server's cgroups, or None and why not (then actions run without them)."""
    if os.geteuid() != 0:
        return None, "the server does not run as root"
    reasons = []
    try:
        bases1, why = _v1_bases()
        if bases1 is not None:
            return Cgroups(1, bases1, pids_max=pids_max), ""
        reasons.append(why)
        base2, why = _v2_base()
        if base2 is not None:
            return Cgroups(2, {"unified": base2}, pids_max=pids_max), ""
        reasons.append(why)
    except (OSError, CgroupError) as exc:
        reasons.append(str(exc))
    return None, "; ".join(reasons)
