"""The baselines ARL-Tangram is compared with (§6.1, §6.3), each an `ActionPolicy` registered
in `ACTION_POLICIES` (the fixed-DoP ones live with Tangram's scheduler)."""

from loom.actions.baselines.independent_api import IndependentApi
from loom.actions.baselines.k8s import KubeConfig, Kubernetes, PodPhase
from loom.actions.baselines.routed import Routed
from loom.actions.baselines.serverlessllm import Serverless, ServerlessConfig
from loom.actions.baselines.sglang_static import Deployment, StaticServing, place_replicas

__all__ = [
    "Deployment",
    "IndependentApi",
    "KubeConfig",
    "Kubernetes",
    "PodPhase",
    "Routed",
    "Serverless",
    "ServerlessConfig",
    "StaticServing",
    "place_replicas",
]
