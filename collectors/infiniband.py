"""RDMA port counters from ``/sys/class/infiniband``.

RDMA traffic (InfiniBand and RoCE) bypasses the kernel's network stack, so ``/proc/net/dev`` (and psutil) never
see it. Each port's ``counters/port_xmit_data`` and ``port_rcv_data`` count 4-byte words; errors come from the
port counters and, where the driver has them, ``hw_counters``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WORD_BYTES = 4
_ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "link_downed", "port_rcv_remote_physical_errors")
_DROP_COUNTERS = ("port_xmit_discards", "port_rcv_switch_relay_errors")
_HW_ERROR_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err")


@dataclass(frozen=True, slots=True)
class RdmaPort:
    device: str  # e.g. mlx5_0
    port: int
    path: Path
    netdev: str | None  # the Ethernet or IPoIB interface it belongs to, when sysfs says
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    rate_mbps: int | None

    @property
    def name(self) -> str:
        return self.netdev or f"{self.device}/{self.port}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _netdev(device_dir: Path, port_dir: Path) -> str | None:
    # RoCE ports name their netdev in the GID table; IPoIB and single-function devices in device/net.
    ndev = _read(port_dir / "gid_attrs" / "ndevs" / "0")
    if ndev:
        return ndev
    try:
        nets = sorted(p.name for p in (device_dir / "device" / "net").iterdir())
    except OSError:
        return None
    return nets[0] if len(nets) == 1 else None


def _rate_mbps(port_dir: Path) -> int | None:
    text = _read(port_dir / "rate")  # e.g. "400 Gb/sec (4X NDR)"
    if not text:
        return None
    head = text.split()[0]
    try:
        return int(float(head) * 1000)
    except ValueError:
        return None


def discover(sysfs_root: Path) -> list[RdmaPort]:
    base = sysfs_root / "class" / "infiniband"
    ports = []
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return []
    for device_dir in devices:
        try:
            port_dirs = sorted((device_dir / "ports").iterdir(), key=lambda p: int(p.name))
        except (OSError, ValueError):
            continue
        for port_dir in port_dirs:
            if not (port_dir / "counters" / "port_xmit_data").exists():
                continue
            ports.append(
                RdmaPort(
                    device=device_dir.name,
                    port=int(port_dir.name),
                    path=port_dir,
                    netdev=_netdev(device_dir, port_dir),
                    link_layer=_read(port_dir / "link_layer") or "InfiniBand",
                    rate_mbps=_rate_mbps(port_dir),
                )
            )
    return ports


def read_counters(port: RdmaPort) -> dict[str, int]:
    """Cumulative counters in the NIC signal names: bytes, errors and drops."""
    counters = port.path / "counters"
    out: dict[str, int] = {}
    tx = _read_int(counters / "port_xmit_data")
    rx = _read_int(counters / "port_rcv_data")
    if tx is not None:
        out["tx_bps"] = tx * WORD_BYTES
    if rx is not None:
        out["rx_bps"] = rx * WORD_BYTES
    hw = port.path / "hw_counters"
    errors = [_read_int(counters / n) for n in _ERROR_COUNTERS] + [_read_int(hw / n) for n in _HW_ERROR_COUNTERS]
    out["errors"] = sum(v for v in errors if v is not None)
    out["drops"] = sum(v for v in (_read_int(counters / n) for n in _DROP_COUNTERS) if v is not None)
    return out
