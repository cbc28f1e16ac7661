"""Workload generators for the simulators."""

from loom.sim.workloads.agentic import PROFILES, TOOL_LATENCY_S, AgenticWorkload, WorkloadProfile

__all__ = ["PROFILES", "TOOL_LATENCY_S", "AgenticWorkload", "WorkloadProfile"]
