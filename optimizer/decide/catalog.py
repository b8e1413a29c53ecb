"""The hardware catalog: GPU models, their datasheet figures, price per GPU-hour and relative throughput per
workload shape (compute-bound, memory-bandwidth-bound), every figure with its source. Shipped as an editable
TOML file (``optimizer/decide/data/catalog.toml``); a file with a figure or a source missing is refused."""

from __future__ import annotations

import math
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from agent.config import TooDeep, parse_toml


class CatalogError(Exception):
    pass


_PCI_ID = re.compile(r"^0x[0-9a-fA-F]{8}$")
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "amd", "intel", "habana"})


def normalise_name(reported: str) -> str:
    """A GPU name compared without case, vendor words, "-" versus " ", spaces around "/", or a MIG slice suffix."""
    base = reported.split(" MIG ", 1)[0]
    # libdrm's amdgpu.ids spells it "MI250X / MI250", amdsmi's market name "MI250X/MI250"
    words = base.lower().replace("-", " ").replace("_", " ").replace("/", " / ").split()
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return " ".join(words)


Method = Literal["mlperf", "roofline", "estimate", "reference"]
Source = Annotated[str, StringConstraints(strip_whitespace=True, min_length=8, max_length=2000)]


class _Part(BaseModel):
    # every figure finite: TOML's inf and nan pass a bound such as gt=0
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Figure(_Part):
    """A relative figure (H100 SXM = 1) and where it comes from: ``mlperf`` (published MLPerf results, per
    accelerator, same round), ``roofline`` (datasheet arithmetic), ``estimate`` (reasoned, not measured), or
    ``reference`` (the H100 SXM itself)."""

    value: float = Field(gt=0, le=20)
    method: Method
    source: Source
    range: tuple[float, float] | None = Field(default=None, description="lowest and highest published result")
    roofline: float | None = Field(default=None, gt=0, le=20, description="datasheet arithmetic, for comparison")
    roofline_basis: str | None = Field(default=None, max_length=200)

    @model_validator(mode="after")
    def _inside(self) -> Figure:
        if self.range is not None and not 0 < self.range[0] <= self.range[1]:
            raise ValueError("range must be [lowest, highest], both positive")
        return self


class Datasheet(_Part):
    """One GPU's figures as its vendor publishes them (dense: without structured sparsity)."""

    bf16_tflops: float = Field(gt=0, description="dense BF16/FP16 tensor TFLOPS")
    fp8_tflops: float = Field(ge=0, description="dense FP8 tensor TFLOPS; 0 where the GPU has no FP8 tensor cores")
    memory_gib: float = Field(gt=0)
    bandwidth_tbps: float = Field(gt=0, description="memory bandwidth, TB/s")
    interconnect_gbps: float = Field(gt=0, description="GPU-to-GPU bandwidth per GPU (NVLink, xGMI, or PCIe), GB/s")
    tdp_w: float = Field(gt=0)
    source: Source


class Performance(_Part):
    """Relative throughput of one GPU per workload shape, H100 SXM = 1."""

    compute: Figure = Field(description="compute-bound work: vision, encoders, diffusion, dense training")
    memory: Figure = Field(description="memory-bandwidth-bound work: LLM decode")


class GpuType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    key: str = Field(pattern=r"^[a-z0-9_-]+$")
    name: str
    match: list[str] = Field(min_length=1, description="exact names the vendor tools report")
    pci_ids: list[str] = Field(default_factory=list, description='"0x<device><vendor>", e.g. "0x233010de"')
    nvlink: bool
    fabric: Literal["infiniband", "roce", "ethernet"]
    price_per_gpu_hour: float = Field(gt=0, description="positive: a free GPU would make every move to it a saving")
    price_source: Source
    datasheet: Datasheet
    perf: Performance

    @model_validator(mode="before")
    @classmethod
    def _no_class_throughput(cls, data: object) -> object:
        if isinstance(data, dict) and "throughput" in data:
            raise ValueError(
                "throughput per workload class is replaced by perf.compute and perf.memory, each with a value, "
                "a method and a source (docs/decisions.md)"
            )
        return data

    @model_validator(mode="after")
    def _pci_ids(self) -> GpuType:
        bad = [p for p in self.pci_ids if not _PCI_ID.match(p)]
        if bad:
            raise ValueError(f"pci_ids {', '.join(bad)}: expected 0x followed by 8 hex digits (device, vendor)")
        return self

    def reported_as(self, reported_name: str, pci_id: str | None = None) -> bool:
        """Whether a GPU the vendor tool reports so is this model: by PCI id, else by name as ``Catalog.lookup``."""
        if pci_id and pci_id.lower() in {p.lower() for p in self.pci_ids}:
            return True
        return normalise_name(reported_name) in {normalise_name(m) for m in self.match}

    @property
    def memory_gib(self) -> float:
        return self.datasheet.memory_gib

    @property
    def bandwidth_tbps(self) -> float:
        return self.datasheet.bandwidth_tbps

    @property
    def rdma(self) -> bool:
        return self.fabric in ("infiniband", "roce")

    @property
    def fabric_name(self) -> str:
        return {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}[self.fabric]


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    pcie_training_scaling: Figure = Field(
        description="share of its NVLink throughput a multi-GPU job keeps when its GPUs talk over PCIe"
    )
    hours_per_month: float = Field(default=730, gt=0)

    @model_validator(mode="after")
    def _a_share(self) -> Defaults:
        if self.pcie_training_scaling.value > 1:
            raise ValueError("pcie_training_scaling: a share, at most 1")
        return self


class Correction(BaseModel):
    """A factor learned from applied moves: observed speed of ``to_key`` against ``from_key`` for work of one
    shape, over what the catalog predicted (optimizer/serve/outcomes.py). Learned per site: a catalog planning one
    site carries that site's corrections only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: Literal["compute", "mixed", "memory"]
    from_key: str
    to_key: str
    factor: float = Field(gt=0)
    moves: int = Field(ge=1)
    hours: float = Field(ge=0)
    site: str = Field(default="", description="the site whose applied moves taught it")
    nodes: int = Field(default=0, ge=0, description="distinct target nodes that reported those moves")


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: Defaults
    gpu: list[GpuType] = Field(min_length=1)
    learned: tuple[Correction, ...] = Field(default=(), description="not in the file: set from observed moves")

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
        by_pci, by_name = _index(self)
        if pci_id:
            entry = by_pci.get(pci_id.lower())
            if entry is not None:
                return entry
        return by_name.get(normalise_name(reported_name))

    def by_key(self, key: str) -> GpuType:
        for entry in self.gpu:
            if entry.key == key:
                return entry
        raise KeyError(key)

    def with_corrections(self, learned: tuple[Correction, ...]) -> Catalog:
        """A copy whose projections use ``learned`` correction factors."""
        return self.model_copy(update={"learned": learned})

    def correction(self, shape: str, from_key: str, to_key: str) -> float:
        """The learned factor on the catalog's speed ratio of ``to_key`` over ``from_key`` (1: none learned)."""
        for c in self.learned:
            if c.shape == shape and (c.from_key, c.to_key) == (from_key, to_key):
                return c.factor
            if c.shape == shape and (c.from_key, c.to_key) == (to_key, from_key):
                return 1 / c.factor
        return 1.0

    def with_prices(self, prices: dict[str, float]) -> Catalog:
        """A copy with operator price overrides applied (keys are catalog keys)."""
        unknown = set(prices) - {g.key for g in self.gpu}
        if unknown:
            raise CatalogError(f"price override for unknown GPU {', '.join(sorted(unknown))}")
        bad = sorted(k for k, v in prices.items() if not (math.isfinite(v) and v > 0))
        if bad:  # model_copy below does not validate
            raise CatalogError(f"price override for {', '.join(bad)}: a price per GPU-hour is positive and finite")
        gpus = [g.model_copy(update={"price_per_gpu_hour": prices.get(g.key, g.price_per_gpu_hour)}) for g in self.gpu]
        return self.model_copy(update={"gpu": gpus})


def load_catalog(path: Path | None = None) -> Catalog:
    """Load ``path``, or the catalog shipped with fleetfit."""
    try:
        if path is None:
            text = resources.files("optimizer.decide.data").joinpath("catalog.toml").read_text()
        else:
            text = path.read_text()
        raw = parse_toml(text)
        if "learned" in raw:  # a file's own factors would be taken for what moves measured
            raise CatalogError(
                f"catalog {path or 'built-in'}: learned: not configurable: learned corrections are learned from "
                "observed moves, not configured (`fleetfit catalog` shows those learned)"
            )
        return Catalog.model_validate(raw)
    except (OSError, tomllib.TOMLDecodeError, TooDeep) as exc:
        raise CatalogError(f"catalog {path or 'built-in'}: {exc}") from None
    except ValidationError as exc:
        raise CatalogError(f"catalog {path or 'built-in'}: {_where(exc, text)}") from None


def _where(exc: ValidationError, text: str) -> str:
    """The first error, naming the GPU entry by its key rather than its index."""
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"]]
    if len(loc) >= 2 and loc[0] == "gpu" and loc[1].isdigit():
        try:
            key = tomllib.loads(text)["gpu"][int(loc[1])].get("key", loc[1])
        except (KeyError, IndexError, TypeError, AttributeError, tomllib.TOMLDecodeError):
            key = loc[1]
        loc = [f"gpu {key}:", ".".join(loc[2:])] if len(loc) > 2 else [f"gpu {key}"]
    else:
        loc = [".".join(loc)]
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        msg = "missing (every figure needs its value, method and source)"
    return f"{' '.join(loc)}: {msg}"


_INDEXES: dict[int, tuple[Catalog, dict[str, GpuType], dict[str, GpuType]]] = {}


def _index(catalog: Catalog) -> tuple[dict[str, GpuType], dict[str, GpuType]]:
    """The catalog's entries by PCI id and by normalised name, built once per catalog: every birth's GPUs are
    looked up as it arrives, and every node's at each plan. Keyed by identity (a catalog is frozen; a copy with
    other prices is another catalog), the catalog kept beside its index so that an id is never reused under it."""
    cached = _INDEXES.get(id(catalog))
    if cached is not None and cached[0] is catalog:
        return cached[1], cached[2]
    if len(_INDEXES) >= 256:  # catalogs made per plan (learned corrections): start afresh rather than grow
        _INDEXES.clear()
    by_pci: dict[str, GpuType] = {}
    by_name: dict[str, GpuType] = {}
    for entry in catalog.gpu:  # the first entry to claim a name wins, as the scan it replaces did
        for p in entry.pci_ids:
            by_pci.setdefault(p.lower(), entry)
        for m in entry.match:
            by_name.setdefault(normalise_name(m), entry)
    _INDEXES[id(catalog)] = (catalog, by_pci, by_name)
    return by_pci, by_name
