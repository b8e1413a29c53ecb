"""The hardware catalog: GPU models, their capabilities, price per GPU-hour and relative throughput per
workload class. Shipped as an editable TOML file (``optimizer/data/catalog.toml``)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.protocol import WorkloadClass


class CatalogError(Exception):
    pass


class GpuType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(pattern=r"^[a-z0-9_-]+$")
    name: str
    match: list[str] = Field(min_length=1)
    memory_gib: float = Field(gt=0)
    bandwidth_tbps: float = Field(gt=0)
    nvlink: bool
    fabric: Literal["infiniband", "roce", "ethernet"]
    price_per_gpu_hour: float = Field(ge=0)
    throughput: dict[WorkloadClass, float]

    @model_validator(mode="after")
    def _every_class(self) -> GpuType:
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
        return self

    def lookup(self, reported_name: str) -> GpuType | None:
        """The catalog entry for a GPU name as NVML reports it, or None."""
        lowered = reported_name.lower()
        for entry in self.gpu:
            if any(pattern.lower() in lowered for pattern in entry.match):
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
