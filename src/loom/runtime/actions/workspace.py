"""Trajectory workspaces: one directory per trajectory that every action of it runs in, so what
one action writes is there for the next (the environment state AOE preserves between
actions), removed when the trajectory ends."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

__all__ = ["Workspaces"]


class Workspaces:
    """Directories under `root` (a fresh temporary directory, removed on `close`, when None)."""

    def __init__(self, root: Path | None) -> None:
        self.owned = root is None  # a temporary directory, removed with the server
        # absolute: the sandbox hides and binds it by path, from another working directory
        self.root = (
            Path(tempfile.mkdtemp(prefix="loom-actions-")) if root is None else root.resolve()
        )
        self.root.mkdir(parents=True, exist_ok=True)
        self._base = self.root / "trajectories"
        self._base.mkdir(exist_ok=True)

    def path(self, trajectory_id: str) -> Path:
        # Trajectory ids are validated as [A-Za-z0-9][A-Za-z0-9._-]*: no separators, no "..".
        assert "/" not in trajectory_id and not trajectory_id.startswith("."), trajectory_id
        return self._base / trajectory_id

    def open(self, trajectory_id: str) -> Path:
        """The trajectory's directory, created on its first action."""
        path = self.path(trajectory_id)
        path.mkdir(exist_ok=True)
        return path

    def remove(self, trajectory_id: str) -> bool:
        """Delete the trajectory's directory; False when it had none."""
        path = self.path(trajectory_id)
        if not path.exists():
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True

    def close(self) -> None:
        if self.owned:
            shutil.rmtree(self.root, ignore_errors=True)
