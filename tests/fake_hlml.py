"""A stand-in for habana-pyhlml's ``pyhlml.main`` on machines without a Gaudi, shaped after its source (1.24).

Like the real one: errors are ``HLMLError(code)`` (UNINITIALIZED = 1, NOT_SUPPORTED = 3, DRIVER_NOT_LOADED = 9,
AIP_IS_LOST = 15); ``hlmlInit`` without libhlml prints "Failed to load libhlml" to stdout and raises
``HLMLError(1)``, with the library but no driver loaded it raises ``DRIVER_NOT_LOADED`` (``m.init_error``, which
may be cleared later: a driver loaded after boot); calls before a successful init raise ``UNINITIALIZED``; names, UUIDs
and versions are bytes; memory in bytes, power in mW; ``pci_device_id`` is the device id in the high 16 bits.
``hlmlDeviceGetUtilizationRates`` differs between releases: a struct with ``aip`` and ``memory`` (1.24), a struct
with ``aip`` only (``hlml_utilization_t`` before the memory field), or the plain ``aip`` int (early releases).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

UNINITIALIZED = 1
DRIVER_NOT_LOADED = 9


class HLMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"HLML Error with code {self.value}"


@dataclass
class FakeGaudi:
    name: bytes = b"HL-225"
    device_id: int = 0x1020
    minor: int = 0
    memory_total: int = 96 * 2**30
    memory_used: int = 70 * 2**30
    aip: int = 93
    memory_util: int = 35
    power_mw: int = 480_000
    limit_mw: int = 600_000  # the limit in force (hl-smi --power-limit lowers it); the default stays 600 W
    handle_error: int | None = None
    unsupported: set[str] = field(default_factory=set)


def make_fake_hlml(
    devices: list[FakeGaudi],
    library: bool = True,
    utilization: str = "aip+memory",
    init_error: int | None = None,
    current_limit: bool = True,
) -> types.ModuleType:
    """``utilization``: what the binding's utilisation call returns: "aip+memory", "aip" (a struct) or "int".
    ``current_limit``: the binding has ``hlmlDeviceGetPowerManagementLimit`` (older pyhlml has only the default)."""
    m = types.ModuleType("fake_pyhlml_main")
    m.HLMLError = HLMLError  # type: ignore[attr-defined]
    m.init_error = init_error  # type: ignore[attr-defined]
    m.inits = 0  # type: ignore[attr-defined]  # successful hlmlInit calls: each one re-opens every device
    state = {"init": False}

    def dev(name: str, h: FakeGaudi) -> FakeGaudi:
        if not state["init"]:
            raise HLMLError(UNINITIALIZED)
        if name in h.unsupported:
            raise HLMLError(3)
        return h

    def init() -> None:
        if not library:
            print("Failed to load libhlml")  # the real binding does exactly this, on stdout
            raise HLMLError(UNINITIALIZED)
        if m.init_error is not None:  # type: ignore[attr-defined]
            raise HLMLError(m.init_error)  # type: ignore[attr-defined]
        state["init"] = True
        m.inits += 1  # type: ignore[attr-defined]

    def initialised() -> None:
        if not state["init"]:
            raise HLMLError(UNINITIALIZED)

    def count() -> int:
        initialised()
        return len(devices)

    def handle(i: int) -> FakeGaudi:
        initialised()
        if devices[i].handle_error is not None:
            raise HLMLError(devices[i].handle_error)  # type: ignore[arg-type]
        return devices[i]

    def util(h: FakeGaudi) -> object:
        g = dev("util", h)
        if utilization == "int":
            return g.aip
        if utilization == "aip":
            return types.SimpleNamespace(aip=g.aip)
        return types.SimpleNamespace(aip=g.aip, memory=g.memory_util)

    m.hlmlInit = init  # type: ignore[attr-defined]
    m.hlmlShutdown = lambda: state.update(init=False)  # type: ignore[attr-defined]
    m.hlmlDeviceGetCount = count  # type: ignore[attr-defined]
    m.hlmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    m.hlmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    m.hlmlDeviceGetName = lambda h: dev("name", h).name  # type: ignore[attr-defined]
    m.hlmlDeviceGetUUID = lambda h: f"01P0-HL2080A0-15-TNPS34-{dev('uuid', h).minor:02d}".encode()  # type: ignore[attr-defined]
    m.hlmlDeviceGetMinorNumber = lambda h: dev("minor", h).minor  # type: ignore[attr-defined]
    m.hlmlDeviceGetPCIInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        pci_device_id=(dev("pci", h).device_id << 16) | 0x1DA3, bus_id=b"0000:19:00.0"
    )
    m.hlmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=dev("memory", h).memory_total, used=h.memory_used, free=h.memory_total - h.memory_used
    )
    m.hlmlDeviceGetPowerUsage = lambda h: dev("power", h).power_mw  # type: ignore[attr-defined]
    m.hlmlDeviceGetTemperature = lambda h, sensor: 45 if dev("temp", h) else 0  # type: ignore[attr-defined]
    m.hlmlDeviceGetPowerManagementDefaultLimit = lambda h: 600_000 if dev("limit", h) else 0  # type: ignore[attr-defined]
    if current_limit:
        m.hlmlDeviceGetPowerManagementLimit = lambda h: dev("limit", h).limit_mw  # type: ignore[attr-defined]
    m.hlmlDeviceGetCurrPCIELinkGeneration = lambda h: 4 if dev("pcie", h) else 0  # type: ignore[attr-defined]
    m.hlmlDeviceGetCurrPCIELinkWidth = lambda h: 16 if dev("pcie", h) else 0  # type: ignore[attr-defined]
    m.hlmlGetDriverVersion = lambda: initialised() or b"1.18.0-ee698fb"  # type: ignore[attr-defined,func-returns-value]
    return m
