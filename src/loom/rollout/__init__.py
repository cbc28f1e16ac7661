"""Rollout level: where and how trajectories run on LLM rollout workers."""
