"""verl's router package (pull request 7115): the protocol, the registry and the factory;
importing it registers the built-in strategies (here none: Loom's registers itself)."""

from .base import LoadBalancerRegistry, RequestLoadBalancer, get_router_handle

__all__ = ["LoadBalancerRegistry", "RequestLoadBalancer", "get_router_handle"]
