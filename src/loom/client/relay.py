"""The weight relay's client (`loom.runtime.relay.client`, beside the service: training and
serving ranks use it too), under the clients' package."""

from loom.runtime.relay.client import RelayClient

__all__ = ["RelayClient"]
