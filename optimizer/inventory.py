"""Plausibility of a node's claimed hardware: a node that claims GPUs it does not have would be planned
moves onto them. The catalog knows each model's memory; a node holds a bounded number of GPUs."""

from __future__ import annotations

import math
from collections.abc import Callable

from agent.protocol import Birth
from optimizer.catalog import Catalog
from optimizer.shares import layout

# NVML reports a little under the marketed size (an H100 80GB: 81,559 MiB); more than this over it is a lie.
MEMORY_SLACK = 1.05
# No GPU model ships with more than this; it bounds models the catalog does not know.
MAX_MEMORY_MIB = 512 * 1024


def inventory_check(catalog: Catalog, max_gpus_per_node: int) -> Callable[[Birth], str | None]:
    """A check that says why a birth's inventory is implausible, or None when it is not."""

    def check(birth: Birth) -> str | None:
        physical = [g for g in birth.gpus if g.parent is None]
        # Physical GPUs: an AMD compute partition is its share of one (eight MI300X in CPX are 64 devices, 8 GPUs)
        gpus = math.ceil(layout(birth).gpus - 1e-9)
        if gpus > max_gpus_per_node:
            devices = f" in {len(physical)} devices" if len(physical) != gpus else ""
            return f"{gpus} GPUs{devices}; a node holds at most {max_gpus_per_node} (optimizer.max_gpus_per_node)"
        if birth.gpus and not physical:
            return "MIG instances without their GPU"
        memory = {g.index: g.memory_mib for g in physical}
        for g in birth.gpus:
            hardware = catalog.lookup(g.model)
            cap = hardware.memory_gib * 1024 * MEMORY_SLACK if hardware is not None else MAX_MEMORY_MIB
            if g.parent is not None:
                cap = memory.get(g.parent, cap)
            if g.memory_mib > cap:
                return f"GPU {g.index} ({g.model}) claims {g.memory_mib} MiB, more than its {cap:.0f}"
        return None

    return check
