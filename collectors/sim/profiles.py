"""Physical profiles of common GPU nodes, used by the simulated backend.

Figures are vendor specifications: memory, NVLink, power, and the node's NIC layout (fabric NICs for
east-west all-reduce traffic, front-end NICs for north-south client traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol import HostInfo, NetworkMount, NicKind
from collectors.hostinfo import link_estimate


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


# ----------------------------------------------------------------------------------------- the rest of the node

TIB_MIB = 1024 * 1024
GEN4, GEN5 = 16.0, 32.0  # PCIe link rates, GT/s


def _host(cpus: int, memory_tib: float, drives: int, drive_tb: float, gen: float, mounts: tuple[str, ...]) -> HostInfo:
    """A node's host as its agent would read it: the NVMe read figure is the agent's own estimate from each drive's
    PCIe link (x4), collectors/hostinfo.py."""
    per_drive = link_estimate(gen, 4) or 0.0
    return HostInfo(
        cpu_cores=cpus,
        memory_mib=round(memory_tib * TIB_MIB),
        local_nvme_bytes=round(drives * drive_tb * 1e12),
        local_nvme_read_bps=drives * per_drive,
        network_mounts=[NetworkMount(path=m, fstype="nfs4") for m in mounts],
    )


# Each profile's host. Assumptions, each from the product named:
# - h100, h200: NVIDIA DGX H100/H200 (DGX H100/H200 User Guide, "Hardware Overview"): 2 x Xeon Platinum 8480C,
#   56 cores each, 224 logical CPUs (28 per GPU); 2 TB memory; 8 x 3.84 TB U.2 NVMe data cache (PCIe 4.0 drives, an
#   assumption: the guide gives capacity, not link); datasets and home over NFS.
# - a100: NVIDIA DGX A100 (DGX A100 User Guide): 2 x AMD EPYC 7742, 64 cores each, 256 logical CPUs; 1 TB; 4 x 3.84 TB
#   PCIe 4.0 NVMe (15 TB).
# - mi300x: an 8-GPU MI300X server configured like a DGX (Dell PowerEdge XE9680: 2 x Xeon 8480+, 224 logical CPUs,
#   2 TB, 8 x 3.84 TB NVMe, an assumption of one configuration among those sold).
# - gaudi2: Intel's HLS-Gaudi2 reference server (Supermicro SYS-820GH-TNR2): 2 x Xeon Platinum 8380, 40 cores each,
#   160 logical CPUs; 1 TB; 4 x 3.84 TB NVMe (an assumption of its storage configuration).
# - l40s: an 8-GPU L40S inference server as sold on NVIDIA's L40S OVX reference configuration (2 x 32-core Xeon,
#   128 logical CPUs, 16 per GPU; 1 TB; 2 x 3.84 TB PCIe 4.0 NVMe): an assumption, server makers vary it.
# - l4: a 2U server holding eight L4 cards with one 32-core CPU (64 logical CPUs, 8 per GPU), 512 GB and one 1.92 TB
#   PCIe 4.0 NVMe drive: an assumption of a typical inference box, not one product's datasheet.
HOSTS: dict[str, HostInfo] = {
    "h100": _host(224, 2.0, 8, 3.84, GEN4, ("/datasets", "/home")),
    "h200": _host(224, 2.0, 8, 3.84, GEN4, ("/datasets", "/home")),
    "a100": _host(256, 1.0, 4, 3.84, GEN4, ("/datasets", "/home")),
    "mi300x": _host(224, 2.0, 8, 3.84, GEN4, ("/datasets",)),
    "gaudi2": _host(160, 1.0, 4, 3.84, GEN4, ("/datasets",)),
    "l40s": _host(128, 1.0, 2, 3.84, GEN4, ()),
    "l4": _host(64, 0.5, 1, 1.92, GEN4, ()),
}
THIN_CPUS_PER_GPU = 8


def thin_host(profile: NodeProfile) -> HostInfo:
    """A thin node of ``profile``: 8 logical CPUs per GPU, no local NVMe beside a SATA boot drive, data over NFS
    only (an older or cheaper build of the same GPUs; an assumption for scenarios that plant one)."""
    usual = HOSTS.get(profile.key)
    memory = usual.memory_mib if usual is not None and usual.memory_mib is not None else TIB_MIB // 2
    return HostInfo(
        cpu_cores=THIN_CPUS_PER_GPU * profile.gpus,
        memory_mib=memory,
        local_nvme_bytes=0,
        local_nvme_read_bps=0.0,
        network_mounts=[NetworkMount(path="/datasets", fstype="nfs4"), NetworkMount(path="/home", fstype="nfs4")],
    )
