"""A stand-in for verl as its KV-cache-aware balancer work shapes the balancer contract
(github.com/verl-project/verl pull request 7115, head 0b402ca, 2026-07-31; not in main
1dda039 of 2026-08-22 nor in a release): only what building and calling a balancer touches,
written for Loom's tests from a reading of that code, none of it copied. On `PYTHONPATH` it
shadows an installed verl (`tests/integrations/verl_replay_driver.py registry`)."""

__version__ = "0.10.0.dev0"
