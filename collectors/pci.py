"""Which accelerator vendors a node has, read from the PCI bus (``/sys/bus/pci/devices/*/vendor`` and ``class``).

A vendor's library on disk says nothing about its hardware: golden images carry NVIDIA's, AMD's and Habana's user
space on every node of a mixed fleet. The PCI bus says which devices are there, so each vendor's library is
opened only where its devices are, and every vendor present is read.
"""

from __future__ import annotations

import os
from pathlib import Path

NVIDIA_VENDOR_ID = 0x10DE
AMD_VENDOR_ID = 0x1002  # AMD's GPUs (ATI's id); AMD's CPUs and chipsets are 0x1022, never counted
HABANA_VENDOR_ID = 0x1DA3
VENDORS = {NVIDIA_VENDOR_ID: "NVIDIA", AMD_VENDOR_ID: "AMD", HABANA_VENDOR_ID: "Habana"}
# PCI class codes (PCI Code and ID Assignment Specification, base class 03h and 12h): display controllers (VGA
# 0300, 3D 0302, other 0380: H100 is 0302, MI300X 0380) and processing accelerators (1200: Gaudi). Everything else
# a GPU vendor puts on the bus is left out: NVSwitches (0680 bridges), HDMI audio functions (0403), USB-C ports.
_DISPLAY_CLASS = 0x03
_ACCELERATOR_CLASS = 0x1200


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def accelerators(sysfs_root: Path = Path("/sys")) -> dict[int, list[str]] | None:
    """PCI addresses of each supported vendor's display and accelerator devices, by vendor id; None where the bus
    cannot be read (no sysfs, as in some containers): then the caller cannot know and tries every library."""
    devices = sysfs_root / "bus" / "pci" / "devices"
    try:
        addresses = sorted(os.listdir(devices))
    except OSError:
        return None
    found: dict[int, list[str]] = {}
    for address in addresses:
        vendor = _hex(devices / address / "vendor")
        if vendor not in VENDORS:
            continue
        klass = _hex(devices / address / "class")
        if klass is None or (klass >> 16 != _DISPLAY_CLASS and klass >> 8 != _ACCELERATOR_CLASS):
            continue
        found.setdefault(vendor, []).append(address)
    return found
