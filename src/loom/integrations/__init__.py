"""Loom's policies inside other RL frameworks' extension points."""
