"""Physical profiles of common GPU nodes, used by the simulated backend.

Figures are vendor specifications: memory, NVLink, power, and the node's NIC layout (fabric NICs for
east-west all-reduce traffic, front-end NICs for north-south client traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol import NicKind


@dataclass(frozen=True, slots=True)
class NicSpec:
    name: str
    kind: NicKind
    speed_mbps: int


@dataclass(frozen=True, slots=True)
class NodeProfile:
    key: str
    gpu_model: str  # as NVML reports it
    gpus: int
    memory_mib: int
    nvlink_links: int  # per GPU; 0 for PCIe-only cards
    nvlink_gbps: float  # per-GPU NVLink bandwidth, GB/s per direction
    pcie_gen: int
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: float
    nics: tuple[NicSpec, ...]


def _ib(n: int, speed: int) -> tuple[NicSpec, ...]:
    return tuple(NicSpec(f"ib{i}", NicKind.INFINIBAND, speed) for i in range(n))


def _front(n: int, speed: int) -> tuple[NicSpec, ...]:
    return tuple(NicSpec(f"eth{i}", NicKind.ETHERNET, speed) for i in range(n))


PROFILES: dict[str, NodeProfile] = {
    p.key: p
    for p in (
        NodeProfile(
            "h100",
            "NVIDIA H100 80GB HBM3",
            8,
            81559,
            18,
            450.0,
            5,
            700,
            70,
            1980,
            _ib(8, 400_000) + _front(2, 100_000),
        ),
        NodeProfile(
            "h200",
            "NVIDIA H200",
            8,
            143771,
            18,
            450.0,
            5,
            700,
            75,
            1980,
            _ib(8, 400_000) + _front(2, 100_000),
        ),
        NodeProfile(
            "a100",
            "NVIDIA A100-SXM4-80GB",
            8,
            81920,
            12,
            300.0,
            4,
            400,
            55,
            1410,
            _ib(4, 200_000) + _front(2, 100_000),
        ),
        NodeProfile("l40s", "NVIDIA L40S", 8, 46068, 0, 0.0, 4, 350, 35, 2520, _front(2, 100_000)),
        NodeProfile("l4", "NVIDIA L4", 8, 23034, 0, 0.0, 4, 72, 16, 2040, _front(2, 100_000)),
        NodeProfile(
            "mi300x",
            "AMD Instinct MI300X",
            8,
            196608,
            7,
            64.0,
            5,
            750,
            90,
            2100,
            tuple(NicSpec(f"roce{i}", NicKind.ROCE, 400_000) for i in range(8)) + _front(2, 100_000),
        ),
        # HLS-Gaudi2: 21 of each card's 24 on-chip 100 GbE ports connect the eight cards all-to-all (262.5 GB/s
        # per card per direction); the other three leave through six 400 GbE QSFP-DD ports.
        NodeProfile(
            "gaudi2",
            "Intel Gaudi 2",
            8,
            98304,
            21,
            262.5,
            4,
            600,
            90,
            1650,
            tuple(NicSpec(f"roce{i}", NicKind.ROCE, 400_000) for i in range(6)) + _front(2, 100_000),
        ),
    )
}
