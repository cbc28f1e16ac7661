"""Resource managers (Tangram §5) behind one interface: API quotas, CPU cores, GPU chunks."""

from loom.actions.managers.base import Grant, Ledger, ResourceManager
from loom.actions.managers.basic import ApiLimit, BasicManager
from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.managers.gpu import GpuManager, GpuNode, ServiceSpec

__all__ = [
    "ApiLimit",
    "BasicManager",
    "CpuManager",
    "CpuNode",
    "GpuManager",
    "GpuNode",
    "Grant",
    "Ledger",
    "ResourceManager",
    "ServiceSpec",
]
