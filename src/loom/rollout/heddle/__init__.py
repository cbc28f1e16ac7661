"""Heddle (trajectory-centric agentic rollout): placement and resource management policies."""
