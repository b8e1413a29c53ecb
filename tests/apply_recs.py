"""The recommendations the `fleetfit apply` tests carry out: a Slurm job's move and a Kubernetes workload's move,
with the fields each test cares about given as overrides."""

from __future__ import annotations

from typing import Any

from agent.protocol import Recommendation, WorkloadClass


def slurm_move(job_id: str | int, **override: Any) -> Recommendation:
    """One GPU of batch inference moved from an H100 node's partition to an L40S node's."""
    fields: dict[str, Any] = {
        "id": f"move-{job_id}",
        "workload": f"slurm/{job_id}",
        "workload_name": "fleetfit-test",
        "workload_class": WorkloadClass.BATCH_INFERENCE,
        "confidence": 0.9,
        "gpus": 1,
        "from_node": "h100-1",
        "from_hardware": "H100 80GB",
        "to_node": "l40s-1",
        "to_hardware": "L40S 48GB",
        "monthly_savings_usd": 1500.0,
        "reason": "batch inference at 30 % on an H100",
    }
    return Recommendation(**(fields | override))


def k8s_move(**override: Any) -> Recommendation:
    """Two GPUs of a Deployment's inference moved from H100s to L40S."""
    fields: dict[str, Any] = {
        "id": "rec-k8s",
        "workload": "k8s/6f1c",
        "workload_name": "chat-7d9c5b6f4d-x2x4z",
        "workload_class": WorkloadClass.INFERENCE,
        "confidence": 0.9,
        "gpus": 2,
        "from_node": "h100-01",
        "from_hardware": "H100 80GB",
        "to_node": "l40s-03",
        "to_hardware": "L40S 48GB",
        "monthly_savings_usd": 3000.0,
        "reason": "inference at 25 % on H100s",
    }
    return Recommendation(**(fields | override))
