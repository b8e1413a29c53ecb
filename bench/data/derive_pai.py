"""Derive bench/data/pai_fleet.csv from Alibaba's public PAI GPU traces (see bench/data/README.md).

    python3 bench/data/derive_pai.py MACHINE_SPEC_CSV POD_LIST_CSV > bench/data/pai_fleet.csv

MACHINE_SPEC_CSV: cluster-trace-gpu-v2020's pai_machine_spec.csv (headerless: machine, gpu_type, cap_cpu,
cap_mem, cap_gpu). POD_LIST_CSV: cluster-trace-gpu-v2023's csv/openb_pod_list_default.csv (with its header).
Standard library only; the output is a function of the two files and SEED.
"""

from __future__ import annotations

import csv
import itertools
import random
import sys
from collections import Counter

SEED = 2020
KEEP = (0, 1)  # of every three machines of a (type, GPUs) stratum in machine-id order, those at these places
# the trace's GPU types as shipped catalog keys, with their memory (GiB) for the memory a workload pins
CATALOG = {"V100M32": "v100", "V100": "v100_16gb", "P100": "v100_pcie_16gb", "T4": "t4", "MISC": "t4"}
MEMORY_GIB = {"v100": 32, "v100_16gb": 16, "v100_pcie_16gb": 16, "t4": 16}
# pai_sensor_table's gpu_wrk_util (an instance's lifetime mean) as quantiles: (cumulative share, percent).
# Third-party analysis of the full table (3,033,232 instances): 34.5 % exactly 0, median 1.5 %, 75.4 % below
# 10 %, 95 % below 50 % (affinode.io/case-studies/alibaba-gpu-v2020/case-study.html).
UTIL_QUANTILES = ((0.0, 0.0), (0.345, 0.0), (0.5, 1.5), (0.754, 10.0), (0.95, 50.0), (1.0, 100.0))


def utilisation(u: float) -> float:
    """The inverse of UTIL_QUANTILES' distribution, linear between its points."""
    for (p0, v0), (p1, v1) in itertools.pairwise(UTIL_QUANTILES):
        if u <= p1:
            return v0 if p1 == p0 else v0 + (v1 - v0) * (u - p0) / (p1 - p0)
    return 100.0


def main(spec_path: str, pods_path: str) -> None:
    rng = random.Random(SEED)
    strata: dict[tuple[str, int], list[str]] = {}
    with open(spec_path, newline="") as f:
        for machine, gpu_type, _cpu, _mem, cap_gpu in csv.reader(f):
            if gpu_type in CATALOG and int(cap_gpu) > 0:
                strata.setdefault((gpu_type, int(cap_gpu)), []).append(machine)
    nodes: list[tuple[str, str, int]] = []
    for (gpu_type, gpus), machines in sorted(strata.items()):
        for i, machine in enumerate(sorted(machines)):
            if i % 3 in KEEP:
                nodes.append((f"pai-{gpu_type.lower()}-{machine[:8]}", CATALOG[gpu_type], gpus))
    capacity = sum(g for _, _, g in nodes)

    with open(pods_path, newline="") as f:
        pods = [r for r in csv.DictReader(f) if int(r["num_gpu"]) > 0]
    running = [p for p in pods if p["pod_phase"] == "Running"]
    trace_gpus = 6212  # GPUs of the v2023 trace's 1,213 GPU nodes (openb_node_list_gpu_node.csv)
    held = sum(int(p["num_gpu"]) * int(p["gpu_milli"]) / 1000 for p in running)
    target = capacity * held / trace_gpus  # the same share of the fleet allocated as in the trace's snapshot
    running.sort(key=lambda p: (int(p["creation_time"]), p["name"]))

    # first come, first served: each pod on a random node with room, as a scheduler with no regard to cost
    free = {name: [1000] * gpus for name, _, gpus in nodes}
    order = [name for name, _, _ in nodes]
    rows, allocated = [], 0.0
    for pod in running:
        if allocated >= target:
            break
        gpus, milli = int(pod["num_gpu"]), int(pod["gpu_milli"])
        rng.shuffle(order)
        for name in order:
            slots = free[name]
            if milli < 1000:
                fit = next((i for i, m in enumerate(slots) if 0 < m < 1000 and m >= milli), None)
                fit = fit if fit is not None else next((i for i, m in enumerate(slots) if m >= milli), None)
                if fit is None:
                    continue
                slots[fit] -= milli
            else:
                whole = [i for i, m in enumerate(slots) if m == 1000]
                if len(whole) < gpus:
                    continue
                for i in whole[:gpus]:
                    slots[i] = 0
            break
        else:
            continue
        hardware = next(h for n, h, _ in nodes if n == name)
        share = milli / 1000 if milli < 1000 else 1.0
        online = pod["qos"] == "LS"
        mean = round(min(100.0, utilisation(rng.random())), 2)
        cls = "idle" if mean == 0.0 else "inference" if online else "training"
        p95 = round(min(100.0, mean * (1.7 if online else 1.05)), 2)
        mem = round(share * MEMORY_GIB[hardware] * rng.uniform(0.3, 0.9), 2)
        rows.append((pod["name"], name, cls, gpus, share, mean, p95, mem))
        allocated += gpus * share

    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["kind", "name", "node_or_hardware", "class", "gpus", "share", "mean_util", "p95_util", "mem_gib"])
    for name, hardware, gpus in nodes:
        out.writerow(["node", name, hardware, "", gpus, "", "", "", ""])
    for row in rows:
        out.writerow(["workload", *row])
    counts = Counter(h for _, h, _ in nodes)
    print(f"{len(nodes)} nodes ({dict(counts)}), {capacity} GPUs; {len(rows)} workloads, "
          f"{allocated:.0f} GPUs held (target {target:.0f})", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
