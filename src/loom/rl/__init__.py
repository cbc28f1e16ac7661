"""RL loops that stack Loom's three levels: training on the cluster service, rollouts through
the rollout router into engines whose weights follow training, tools and rewards in the action
server's sandbox (`loom run grpo`)."""
