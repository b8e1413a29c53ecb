"""What the optimizer writes to the time-series store: measurements, tags and fields, in one place.

Dashboards and tests read these names from here; the store builds its points from them. InfluxDB keeps
``measurement`` + ``field``; VictoriaMetrics, fed the same line protocol, names the series
``{measurement}_{field}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Measurement:
    name: str
    tags: tuple[str, ...]
    fields: tuple[str, ...]
    tag_set: frozenset[str] = field(init=False, repr=False, compare=False)
    field_set: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = (self.name, *self.tags, *self.fields)
        if not all(n.replace("_", "").isalnum() and n.isascii() for n in names):
            raise ValueError(f"{self.name}: names must be plain identifiers (written to line protocol unescaped)")
        object.__setattr__(self, "tag_set", frozenset(self.tags))
        object.__setattr__(self, "field_set", frozenset(self.fields))


GPU = Measurement(
    "fleetfit_gpu",
    ("site", "node", "gpu", "model", "workload"),
    (
        "util", "util_p95", "util_max", "mem_util", "mem_used_mib", "power_w", "temp_c", "sm_clock_mhz",
        "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps", "sm_active", "tensor_active",
        "dram_active", "xid_events",
    ),
)  # fmt: skip
NIC = Measurement("fleetfit_nic", ("site", "node", "nic", "role"), ("rx_bps", "tx_bps", "rx_bps_max", "tx_bps_max",
                                                                     "errors", "drops"))  # fmt: skip
DISK = Measurement("fleetfit_disk", ("site", "node", "disk"), ("read_bps", "write_bps", "write_bps_max", "read_iops",
                                                              "write_iops"))  # fmt: skip
HOST = Measurement("fleetfit_host", ("site", "node"), ("cpu_util", "mem_used_pct"))
WORKLOAD = Measurement(
    "fleetfit_workload", ("site", "workload", "name", "class", "hardware"), ("confidence", "gpus", "mean_util")
)
FINDING = Measurement(
    "fleetfit_finding", ("site", "workload", "kind", "hardware"), ("wasted_usd_per_hour", "confidence")
)
RECOMMENDATION = Measurement(
    "fleetfit_recommendation",
    ("site", "id", "workload", "class", "from_node", "to_node", "from_hardware", "to_hardware", "kind"),
    ("monthly_savings_usd", "confidence", "gpus", "wave", "gpus_after"),
)
PLAN = Measurement(
    "fleetfit_plan",
    ("site", "status"),
    ("objective_usd", "best_bound_usd", "gap", "solve_seconds", "monthly_savings_usd", "recommendations",
     "workloads", "wasted_usd_per_hour", "bound_savings_usd"),
)  # fmt: skip

ALL = (GPU, NIC, DISK, HOST, WORKLOAD, FINDING, RECOMMENDATION, PLAN)
