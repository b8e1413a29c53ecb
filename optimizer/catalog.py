"""The hardware catalog: GPU models, their capabilities, price per GPU-hour and relative throughput per
workload class. Shipped as an editable TOML file (``optimizer/data/catalog.toml``)."""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.protocol import WorkloadClass


class CatalogError(Exception):
    pass


_PCI_ID = re.compile(r"^0x[0-9a-fA-F]{8}$")
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "amd", "intel", "habana"})


def normalise_name(reported: str) -> str:
    """A GPU name compared without case, vendor words, "-" versus " ", or a MIG slice suffix."""
    base = reported.split(" MIG ", 1)[0]
    words = base.lower().replace("-", " ").replace("_", " ").split()
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return " ".join(words)


class GpuType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(pattern=r"^[a-z0-9_-]+$")
    name: str
    match: list[str] = Field(min_length=1, description="exact names the vendor tools report")
    pci_ids: list[str] = Field(default_factory=list, description='"0x<device><vendor>", e.g. "0x233010de"')
    memory_gib: float = Field(gt=0)
    bandwidth_tbps: float = Field(gt=0)
    nvlink: bool
    fabric: Literal["infiniband", "roce", "ethernet"]
    price_per_gpu_hour: float = Field(ge=0)
    throughput: dict[WorkloadClass, float]

    @model_validator(mode="after")
    def _every_class(self) -> GpuType:
        bad = [p for p in self.pci_ids if not _PCI_ID.match(p)]
        if bad:
            raise ValueError(f"pci_ids {', '.join(bad)}: expected 0x followed by 8 hex digits (device, vendor)")
        missing = [c.value for c in WorkloadClass if c not in self.throughput]
        if missing:
            raise ValueError(f"throughput lacks {', '.join(missing)}")
        if any(v <= 0 for v in self.throughput.values()):
            raise ValueError("throughput values must be positive")
        return self

    @property
    def rdma(self) -> bool:
        return self.fabric in ("infiniband", "roce")

    @property
    def fabric_name(self) -> str:
        return {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}[self.fabric]


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pcie_training_scaling: float = Field(default=0.6, gt=0, le=1)
    hours_per_month: float = Field(default=730, gt=0)


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: Defaults = Field(default_factory=Defaults)
    gpu: list[GpuType] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_keys(self) -> Catalog:
        keys = [g.key for g in self.gpu]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate gpu key")
        for what, values in (
            ("match name", [(normalise_name(m), g.key) for g in self.gpu for m in g.match]),
            ("pci id", [(p.lower(), g.key) for g in self.gpu for p in g.pci_ids]),
        ):
            seen: dict[str, str] = {}
            for value, key in values:
                if seen.setdefault(value, key) != key:
                    raise ValueError(f"{what} {value!r} is claimed by both {seen[value]} and {key}")
        return self

    def lookup(self, reported_name: str, pci_id: str | None = None) -> GpuType | None:
        """The entry for a GPU as the vendor tool reports it: by PCI id, else by exact name; None if unknown.

        Exact, not substring: "NVIDIA L40" is not an L4, "NVIDIA GH200 480GB" not an H200, "NVIDIA H100 PCIe"
        not an H100 SXM.
        """
        if pci_id:
            wanted = pci_id.lower()
            for entry in self.gpu:
                if wanted in (p.lower() for p in entry.pci_ids):
                    return entry
        name = normalise_name(reported_name)
        for entry in self.gpu:
            if any(normalise_name(m) == name for m in entry.match):
                return entry
        return None

    def by_key(self, key: str) -> GpuType:
        for entry in self.gpu:
            if entry.key == key:
                return entry
        raise KeyError(key)

    def with_prices(self, prices: dict[str, float]) -> Catalog:
        """A copy with operator price overrides applied (keys are catalog keys)."""
        unknown = set(prices) - {g.key for g in self.gpu}
        if unknown:
            raise CatalogError(f"price override for unknown GPU {', '.join(sorted(unknown))}")
        gpus = [g.model_copy(update={"price_per_gpu_hour": prices.get(g.key, g.price_per_gpu_hour)}) for g in self.gpu]
        return self.model_copy(update={"gpu": gpus})


def load_catalog(path: Path | None = None) -> Catalog:
    """Load ``path``, or the catalog shipped with fleetfit."""
    try:
        if path is None:
            text = resources.files("optimizer").joinpath("data/catalog.toml").read_text()
        else:
            text = path.read_text()
        return Catalog.model_validate(tomllib.loads(text))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"catalog {path or 'built-in'}: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"catalog {path or 'built-in'}: {where}: {first['msg']}") from None
