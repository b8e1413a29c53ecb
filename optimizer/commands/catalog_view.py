"""``fleetfit catalog``: every GPU model's figures, its throughput per workload shape and where each figure comes
from, with the correction factors observed moves have taught."""

from __future__ import annotations

import json

from optimizer.decide.catalog import Catalog, Correction, Figure, GpuType
from optimizer.plan.render import printable


def _figure(f: Figure) -> str:
    return f"{f.value:.2f} {f.method}"


def _row(g: GpuType) -> list[str]:
    d = g.datasheet
    return [
        g.key,
        g.name,
        f"{d.memory_gib:g}",
        f"{d.bandwidth_tbps:g}",
        f"{d.bf16_tflops:g}",
        f"{d.fp8_tflops:g}" if d.fp8_tflops else "-",
        f"{d.interconnect_gbps:g}",
        f"{d.tdp_w:g}",
        f"{g.price_per_gpu_hour:.2f}",
        _figure(g.perf.compute),
        _figure(g.perf.memory),
    ]


HEADERS = ["KEY", "NAME", "GiB", "TB/s", "BF16", "FP8", "LINK GB/s", "TDP W", "$/GPU-h", "COMPUTE", "MEMORY"]


def render_catalog_table(catalog: Catalog) -> str:
    """The figures as a table, then each model's sources, then what observed moves taught."""
    rows = [_row(g) for g in catalog.gpu]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [
        "",
        "COMPUTE / MEMORY: throughput of one GPU against one H100 SXM for compute-bound work (vision, encoders,",
        "diffusion, dense training) and memory-bandwidth-bound work (LLM decode); mlperf: published MLPerf results,",
        "roofline: datasheet arithmetic, estimate: reasoned, not measured. BF16/FP8: dense tensor TFLOPS.",
        "",
        "sources:",
    ]
    for g in catalog.gpu:
        lines.append(f"  {g.key}:")
        lines.append(f"    datasheet: {printable(g.datasheet.source)}")
        for shape, f in (("compute", g.perf.compute), ("memory", g.perf.memory)):
            lines.append(f"    {shape} {f.value:.2f}{_range(f)}: {printable(f.source)}")
        lines.append(f"    price ${g.price_per_gpu_hour:.2f}/GPU-hour: {printable(g.price_source)}")
    scaling = catalog.defaults.pcie_training_scaling
    lines += ["", f"multi-GPU training over PCIe keeps {scaling.value:.0%} of its speed: {printable(scaling.source)}"]
    lines += ["", *_learned_lines(catalog.learned)]
    return "\n".join(lines)


def _range(f: Figure) -> str:
    return f" (published {f.range[0]:.2f}-{f.range[1]:.2f})" if f.range else ""


def _learned_lines(learned: tuple[Correction, ...]) -> list[str]:
    if not learned:
        return ["learned from observed moves: nothing yet (no applied move observed long enough)"]
    lines = ["learned from observed moves (factors on the catalog's speed ratio, shrunk toward 1 on thin evidence):"]
    for c in learned:
        lines.append(
            f"  {c.shape:7} {c.from_key} -> {c.to_key}: x{c.factor:.2f} "
            f"from {c.moves} move(s), {c.hours:.0f} h observed"
        )
    return lines


def render_catalog_json(catalog: Catalog) -> str:
    body = {
        "defaults": catalog.defaults.model_dump(mode="json"),
        "gpu": [g.model_dump(mode="json") for g in catalog.gpu],
        "learned": [c.model_dump(mode="json") for c in catalog.learned],
    }
    return json.dumps(body, indent=2)
