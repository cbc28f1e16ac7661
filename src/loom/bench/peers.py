"""The peer routers a benchmark measures Loom's against, installed by the benchmark (never by
Loom's extras), each at the version RL teams run: sglang-router 0.3.2 (slime launches it),
its successor the SGLang model gateway `smg` 1.13, and `vllm-router` 0.1.17 (its
`sticky_least_loaded` is SkyRL's). sglang-router is used from this environment where it is
installed here; the others (and sglang-router otherwise) live in a virtual environment of
their own (`peer_dir()`), so that their dependencies never meet Loom's.

    python -m loom.bench.peers install [NAME ...]   # all by default
    python -m loom.bench.peers list
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PEERS", "Peer", "PeerUnavailableError", "install", "peer_dir"]


class PeerUnavailableError(RuntimeError):
    """A peer router that is not installed here, and how to install it."""


@dataclass(frozen=True)
class Peer:
    """A peer router: its package at `version`, launched by `exe` (with `sub` before its
    flags), with its `policies`; `module`: where this environment may hold it as a module."""

    name: str
    package: str
    version: str
    exe: str
    policies: tuple[str, ...]
    sub: tuple[str, ...] = ()
    module: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def command(self) -> list[str]:
        """How to launch it (its flags follow); PeerUnavailableError where it is not
        installed."""
        if self.module is not None and importlib.util.find_spec(self.module) is not None:
            return [sys.executable, "-m", f"{self.module}.launch_router", *self.sub]
        exe = peer_dir() / "bin" / self.exe
        if not exe.exists():
            raise PeerUnavailableError(
                f"{self.name} is not installed: python -m loom.bench.peers install {self.name}"
            )
        return [str(exe), *self.sub]

    def installed(self) -> bool:
        try:
            self.command()
        except PeerUnavailableError:
            return False
        return True


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer(
            "sglang",
            "sglang-router",
            "0.3.2",
            "sglang-router",
            ("random", "round_robin", "cache_aware", "power_of_two", "manual"),
            module="sglang_router",
        ),
        Peer(
            "smg",
            "smg",
            "1.13.0",
            "smg",
            ("round_robin", "cache_aware", "power_of_two", "least_load", "manual", "prefix_hash"),
            sub=("launch",),
        ),
        Peer(
            "vllm-router",
            "vllm-router",
            "0.1.17",
            "vllm-router",
            (
                "round_robin",
                "cache_aware",
                "power_of_two",
                "consistent_hash",
                "sticky_least_loaded",
            ),
        ),
    )
}


def peer_dir() -> Path:
    """The peers' virtual environment: `$LOOM_PEERS_DIR`, else `~/.cache/loom/peers`."""
    return Path(os.environ.get("LOOM_PEERS_DIR") or Path.home() / ".cache/loom/peers")


def install(names: list[str] | None = None) -> Path:
    """Install the named peers (all by default) into `peer_dir()`; returns it."""
    chosen = [PEERS[n] for n in (names or list(PEERS))]
    where = peer_dir()
    if not (where / "bin" / "python").exists():
        venv.create(where, with_pip=True)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *(p.requirement for p in chosen)], check=True)
    return where


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loom.bench.peers", description=__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    put = sub.add_parser("install", help="install peers (all by default)")
    put.add_argument("names", nargs="*", help=f"of {', '.join(PEERS)}")
    sub.add_parser("list", help="each peer, its version and whether it is installed")
    args = ap.parse_args(argv)
    if args.what == "install":
        unknown = sorted(set(args.names) - set(PEERS))
        if unknown:
            ap.error(f"unknown peers {unknown}; the peers are {', '.join(PEERS)}")
        print(f"installed into {install(args.names or None)}")
        return
    for p in PEERS.values():
        state = " ".join(p.command()) if p.installed() else "not installed"
        print(f"{p.name:12} {p.requirement:24} {state}")


if __name__ == "__main__":
    main()
