"""A stand-in for verl's main branch (github.com/verl-project/verl 1dda039, 2026-08-22; the
same contract as its v0.9.0): no `verl.workers.rollout.router` module; the balancer class is
passed in code to `LLMServerManager(load_balancer_cls=...)`. Only what building and calling
a balancer touches, written for Loom's tests from a reading of that code, none of it copied.
On `PYTHONPATH` it shadows an installed verl (`tests/integrations/verl_replay_driver.py
main`)."""

__version__ = "0.10.0.dev0"
