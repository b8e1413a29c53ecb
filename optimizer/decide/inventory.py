"""Plausibility of a node's claimed hardware: a node that claims GPUs it does not have would be planned
moves onto them. The catalog knows each model's memory; a node holds a bounded number of GPUs. Where a site keeps
an inventory of record (a CMDB), a node is planned from it whatever its birth claims."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.protocol import Birth
from optimizer.decide.catalog import Catalog, GpuType
from optimizer.ingest.shares import layout

# NVML reports a little under the marketed size (an H100 80GB: 81,559 MiB); more than this over it is a lie.
MEMORY_SLACK = 1.05
# No GPU model ships with more than this; it bounds models the catalog does not know.
MAX_MEMORY_MIB = 512 * 1024


class SiteConfig(Protocol):
    @property
    def inventory(self) -> Path | None: ...


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
            hardware = catalog.lookup(g.model, g.pci_device_id)
            cap = hardware.memory_gib * 1024 * MEMORY_SLACK if hardware is not None else MAX_MEMORY_MIB
            if g.parent is not None:
                cap = memory.get(g.parent, cap)
            if g.memory_mib > cap:
                return f"GPU {g.index} ({g.model}) claims {g.memory_mib} MiB, more than its {cap:.0f}"
        return None

    return check


# ------------------------------------------------------------------------------------- site inventories


class InventoryError(ValueError):
    """A site inventory file that cannot be used, worded for the person who keeps it."""


@dataclass(frozen=True, slots=True)
class Listed:
    """A node as the site's inventory of record (a CMDB export) lists it."""

    hardware: GpuType
    gpus: int


class SiteInventories:
    """Each configured site's nodes, from ``[sites.NAME] inventory = FILE``: a CSV file with a header row
    ``node,hardware,gpus`` (hardware: a catalog key such as ``l40s``, its display name, or the name the vendor
    tool reports). A node whose birth claims other or more GPUs is planned from the inventory and flagged."""

    def __init__(self, sites: dict[str, dict[str, Listed]]) -> None:
        self.sites = sites

    def reconcile(self, site: str, birth: Birth) -> tuple[Birth, str | None]:
        """The birth to plan from, and why it differs from the inventory (None: it agrees, or the site has none)."""
        nodes = self.sites.get(site)
        if nodes is None:
            return birth, None
        listed = nodes.get(birth.node)
        if listed is None:
            return birth, "not in the site inventory"
        physical = [g for g in birth.gpus if g.parent is None]
        claimed = {g.model for g in physical}
        hardware = listed.hardware
        wrong = sorted(
            {
                g.model
                for g in physical
                if g.model != hardware.name and not hardware.reported_as(g.model, g.pci_device_id)
            }
        )
        if len(physical) <= listed.gpus and not wrong:
            return birth, None
        why = f"claims {len(physical)} × {', '.join(sorted(claimed)) or 'no GPU'}; the inventory lists " + (
            f"{listed.gpus} × {listed.hardware.name}"
        )
        kept = {g.index for g in physical[: listed.gpus]}
        model = listed.hardware.match[0]
        memory = int(listed.hardware.memory_gib * 1024)
        gpus = [
            g.model_copy(update={"model": model, "pci_device_id": None, "memory_mib": min(g.memory_mib, memory)})
            for g in birth.gpus
            if (g.parent if g.parent is not None else g.index) in kept
        ]
        return birth.model_copy(update={"gpus": gpus}), why


def _hardware(catalog: Catalog, name: str) -> GpuType | None:
    try:
        return catalog.by_key(name)
    except KeyError:
        pass
    shown = next((g for g in catalog.gpu if g.name == name), None)
    return shown if shown is not None else catalog.lookup(name)


def read_inventory(path: Path, catalog: Catalog) -> dict[str, Listed]:
    """``path``'s nodes; InventoryError naming the file and line for anything that cannot be used."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InventoryError(f"inventory {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InventoryError(f"inventory {path}: not a text file (an inventory is CSV)") from None
    rows = csv.DictReader(io.StringIO(text))
    if rows.fieldnames is None or not {"node", "hardware", "gpus"} <= set(rows.fieldnames):
        raise InventoryError(f"inventory {path}: the first line must name the columns node,hardware,gpus")
    nodes: dict[str, Listed] = {}
    for row in rows:
        where = f"inventory {path}, line {rows.line_num}"
        node, hardware, gpus = ((row.get(k) or "").strip() for k in ("node", "hardware", "gpus"))
        if not node:
            continue
        found = _hardware(catalog, hardware)
        if found is None:
            raise InventoryError(f"{where}: hardware {hardware!r} is not in the catalog (`fleetfit catalog`)")
        if not gpus.isdigit() or not 1 <= int(gpus) <= 64:
            raise InventoryError(f"{where}: gpus {gpus!r} is not a count from 1 to 64")
        if node in nodes:
            raise InventoryError(f"{where}: node {node!r} is listed twice")
        nodes[node] = Listed(found, int(gpus))
    return nodes


def load_inventories(sites: Mapping[str, SiteConfig], catalog: Catalog) -> SiteInventories | None:
    """The configured sites' inventories; None when no site has one."""
    found = {site: read_inventory(s.inventory, catalog) for site, s in sites.items() if s.inventory is not None}
    return SiteInventories(found) if found else None
