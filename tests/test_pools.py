"""Identical nodes solved as pools: the pooled model finds the same optimum as node by node, packs each pool's
share onto concrete nodes that hold it, and keeps replicas apart."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from agent.protocol import WorkloadClass
from optimizer.decide.catalog import load_catalog
from optimizer.decide.costs import Demand
from optimizer.plan.model import solve
from optimizer.plan.pools import Pool, assign, build_pools
from optimizer.plan.problem import Movable, NodeSlot, Problem


def _inference(wid: str, node: str, gpus: int, util: float = 20, service: str | None = None) -> Movable:
    return Movable(wid, node, Demand(WorkloadClass.INFERENCE, gpus, 20_000, util, util * 1.6), 20, service=service)


def test_pools_group_idle_room_by_hardware_and_free_gpus() -> None:
    nodes = [("a", "l40s", 8), ("b", "l40s", 8), ("c", "l40s", 4), ("d", "l40s", 8), ("e", "h100", 8)]
    pools = build_pools(nodes, hosting={"d"})
    assert pools == [Pool("pool:l40s:8", "l40s", 8, ("a", "b"))]  # d hosts a movable workload; c and e are alone
    assert pools[0].capacity_by_size([1, 4, 8]) == {1: 16, 4: 16, 8: 16}
    assert Pool("p", "x", 6, ("m1", "m2")).capacity_by_size([4]) == {4: 8}  # one 4-GPU workload per member


def test_assign_packs_first_fit_decreasing_and_spreads_replicas() -> None:
    pool = Pool("p", "l40s", 8, ("m1", "m2", "m3"))
    work = [("a", 4, None), ("b", 8, None), ("c", 2, None), ("d", 2, None), ("e", 4, "svc"), ("f", 4, "svc")]
    placed, unplaced = assign(pool, work)
    used = Counter()
    for wid, gpus, _ in work:
        used[placed[wid]] += gpus
    assert unplaced == [] and all(v <= 8 for v in used.values())
    assert placed["e"] != placed["f"]
    _, unplaced = assign(Pool("p", "l40s", 6, ("m1", "m2")), [("x", 4, None), ("y", 4, None), ("z", 4, None)])
    assert unplaced == ["z"]


def _fleet(seed: int, spare: int) -> tuple[list[NodeSlot], dict[str, int], list[Movable]]:
    rng = random.Random(seed)
    nodes = [NodeSlot(f"h{i}", "h100", 8) for i in range(12)]
    nodes += [NodeSlot(f"l{i}", "l40s", 8) for i in range(spare)]
    nodes += [NodeSlot(f"a{i}", "a100", 8) for i in range(6)]
    fixed = {f"l{i}": rng.choice([0, 0, 4]) for i in range(spare)}
    movable = []
    for i in range(12):
        for j in range(rng.choice([1, 2])):
            size = rng.choice([2, 4]) if j else rng.choice([2, 4, 8])
            service = "chat" if i % 3 == 0 else None
            movable.append(_inference(f"w{i}-{j}", f"h{i}", size, rng.choice([15, 20, 25]), service))
    return nodes, fixed, movable


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pooled_model_matches_the_node_by_node_optimum(seed: int) -> None:
    catalog = load_catalog()
    nodes, fixed, movable = _fleet(seed, spare=5)
    hosting = {w.node for w in movable}
    pools = build_pools(((n.name, n.hardware, n.gpus - fixed.get(n.name, 0)) for n in nodes), hosting)
    assert sum(p.size for p in pools) >= 8  # the idle A100s and most spare L40S nodes are pooled
    common = {"max_moves": 30, "time_limit_s": 20.0}
    pooled = solve(catalog, Problem(nodes, fixed, movable, pools=True, **common))  # type: ignore[arg-type]
    plain = solve(catalog, Problem(nodes, fixed, movable, pools=False, **common))  # type: ignore[arg-type]
    assert pooled.report.status == plain.report.status == "OPTIMAL"
    assert pooled.report.objective == pytest.approx(plain.report.objective, abs=0.01)
    # the concrete placement holds: no node over its GPUs, no two new replicas of a service on a node
    size = {n.name: n.gpus - fixed.get(n.name, 0) for n in nodes}
    load = Counter()
    for w in movable:
        load[pooled.placement[w.id]] += pooled.gpus[w.id]  # resized serving holds fewer
    assert all(load[n] <= size[n] for n in load)
    moved_chat = [pooled.placement[w.id] for w in movable if w.service and pooled.placement[w.id] != w.node]
    assert len(moved_chat) == len(set(moved_chat))
    assert not any("packing" in why for why in pooled.blocked.values())
