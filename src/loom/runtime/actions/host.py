"""This machine as a CPU node: the cores this process may use, split by NUMA domain, and its
memory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from loom.actions.managers.cpu import CpuNode
from loom.core.errors import ConfigError

__all__ = ["local_cpu_node", "machine_memory_gb", "numa_domains", "parse_cpulist"]

NODE_SYSFS = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Core ids of a Linux cpulist such as "0-3,8,10-11" (sorted, without repeats)."""
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ConfigError(f"bad core list {text!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise ConfigError(f"bad core list {text!r}: {part!r} is not an ascending range")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def numa_domains(cores: Sequence[int], sysfs: Path = NODE_SYSFS) -> tuple[tuple[int, ...], ...]:
    """`cores` grouped by the NUMA node that holds them (from sysfs); cores sysfs does not
    list, or every core when sysfs has no NUMA nodes, form one more domain."""
    wanted = set(cores)
    domains: list[tuple[int, ...]] = []
    nodes = sorted(sysfs.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    for node in nodes:
        try:
            listed = parse_cpulist((node / "cpulist").read_text().strip())
        except (OSError, ConfigError):
            continue
        here = tuple(c for c in listed if c in wanted)
        if here:
            domains.append(here)
            wanted -= set(here)
    if wanted:
        domains.append(tuple(sorted(wanted)))
    return tuple(domains)


def machine_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def local_cpu_node(
    cores: Sequence[int] | None = None, memory_gb: float | None = None, name: str = "local"
) -> CpuNode:
    """The CPU node the server schedules: `cores` (default: every core this process may run
    on), which must all be allowed to this process, and `memory_gb` (default: the machine's)."""
    allowed = os.sched_getaffinity(0)
    chosen = tuple(sorted(allowed)) if cores is None else tuple(cores)
    outside = sorted(set(chosen) - allowed)
    if outside:
        raise ConfigError(
            f"cores {outside} are not available to this process (allowed: {sorted(allowed)})"
        )
    if not chosen:
        raise ConfigError("the action server needs at least one core")
    return CpuNode(
        name=name,
        numa=numa_domains(chosen),
        memory_gb=memory_gb if memory_gb is not None else machine_memory_gb(),
    )
