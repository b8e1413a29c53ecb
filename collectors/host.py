"""Host CPU and memory from psutil. Signals: ``cpu_util`` (%), ``mem_used_pct`` (%)."""

from __future__ import annotations

import psutil

from agent.protocol import WorkloadRef
from collectors.base import Entity, Inventory, Sample


class HostCollector:
    name = "host"

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # primes the counter: the first call always returns 0.0

    def inventory(self) -> Inventory:
        return Inventory()

    def sample(self) -> list[Sample]:
        return [
            Sample(
                Entity.HOST,
                "host",
                gauges={
                    "cpu_util": psutil.cpu_percent(interval=None),
                    "mem_used_pct": psutil.virtual_memory().percent,
                },
            )
        ]

    def workloads(self) -> list[WorkloadRef]:
        return []

    def close(self) -> None:
        return None
