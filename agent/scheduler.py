"""A stand-in for the scheduler a capacity team drives (Kubernetes, Slurm): it carries out, on a simulated
fleet, the actions a person acknowledged in the optimizer, so a closed loop can be watched end to end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import replace

from agent.protocol import Recommendation
from collectors.sim.node import SimulatedNode
from collectors.sim.speed import moved

log = logging.getLogger(__name__)


def carry_out(sims: Sequence[SimulatedNode], rec: Recommendation) -> str | None:
    """Apply ``rec`` to the simulated nodes; None when done, else why not (it is left for a later try)."""
    here = next((s for s in sims if s.node == rec.from_node), None)
    if here is None or not any(w.id == rec.workload for w in here.specs):
        return f"{rec.workload_name} is not on {rec.from_node}"
    if rec.kind == "reclaim":
        here.release(rec.workload)
        return None
    if rec.kind == "consolidate":
        return "sharing a GPU is not simulated"
    there = here if rec.kind == "right_size" else next((s for s in sims if s.node == rec.to_node), None)
    if there is None:
        return f"no simulated node {rec.to_node}"
    spec = next(w for w in here.specs if w.id == rec.workload)
    wanted = int(rec.gpus_after) if rec.gpus_after is not None else len(spec.gpus)
    free = sorted({*there.free_gpus(), *(spec.gpus if there is here else ())})
    if len(free) < wanted:
        return f"{rec.to_node} has {len(free)} free GPU(s), {wanted} needed"
    here.release(rec.workload)
    placed = moved(spec, here.profile.key, there.profile.key, tuple(free[:wanted]))
    if there is not here:  # a rescheduled pod is a new pod: a new uid, the same service name
        placed = replace(placed, id=f"k8s/{uuid.uuid5(uuid.NAMESPACE_URL, f'{spec.id}@{there.node}')}")
    there.admit(placed)
    return None


def _acknowledged(api: str) -> list[Recommendation]:
    url = api.rstrip("/") + "/api/v1/recommendations?state=acknowledged"
    with urllib.request.urlopen(url, timeout=10) as response:
        rows = json.load(response)
    fields = set(Recommendation.model_fields)
    return [Recommendation.model_validate({k: v for k, v in row.items() if k in fields}) for row in rows]


async def apply_acknowledged(
    sims: Sequence[SimulatedNode], api: str, stop: asyncio.Event, every: float = 5.0
) -> list[str]:
    """Every ``every`` seconds until ``stop``, carry out the actions acknowledged in the optimizer at ``api``;
    returns the ids carried out."""
    done: list[str] = []
    told: set[str] = set()
    while not stop.is_set():
        try:
            recs = await asyncio.to_thread(_acknowledged, api)
        except (OSError, ValueError) as exc:
            log.warning("scheduler: cannot read acknowledged actions from %s: %s", api, exc)
            recs = []
        for rec in recs:
            if rec.id in done:
                continue
            why = carry_out(sims, rec)
            if why is None:
                done.append(rec.id)
                log.info("scheduler: carried out %s %s (%s)", rec.kind or "move", rec.workload_name, rec.id)
            elif rec.id not in told:
                told.add(rec.id)
                log.info("scheduler: %s %s not carried out yet: %s", rec.kind or "move", rec.workload_name, why)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
    return done
