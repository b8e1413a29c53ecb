"""The collectors a real node runs, registered explicitly."""

from __future__ import annotations

from agent.config import AgentSettings
from collectors.attribution import Attributor
from collectors.base import Collector
from collectors.gpu import open_gpu_collector
from collectors.host import HostCollector
from collectors.nic import NicCollector
from collectors.storage import StorageCollector


def node_collectors(settings: AgentSettings) -> list[Collector]:
    """GPU (or a null GPU collector saying why not), NICs, block devices and host."""
    return [
        open_gpu_collector(attributor=Attributor(node=settings.node)),
        NicCollector(fabric_patterns=settings.fabric_interfaces),
        StorageCollector(mounts=settings.mounts),
        HostCollector(),
    ]
