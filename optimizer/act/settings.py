"""How a site's scheduler is reached (``[sites.NAME] scheduler = …`` with ``[sites.NAME.slurm]`` or
``[sites.NAME.kubernetes]``): one model per backend."""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field

from agent.config import Section

# Hardware by the name a plan gives it ("L40S 48GB") or its catalog key ("l40s"); values are scheduler names.
HardwareMap = dict[str, str]


@functools.cache
def _catalog_keys() -> dict[str, str]:
    from optimizer.decide.catalog import load_catalog

    return {g.name: g.key for g in load_catalog().gpu}


def pick(mapping: HardwareMap, hardware: str) -> str | None:
    """The value ``mapping`` gives ``hardware`` (a plan's name for it): by that name, else by its catalog key."""
    if hardware in mapping:
        return mapping[hardware]
    key = _catalog_keys().get(hardware)
    return mapping.get(key) if key is not None else None


class SlurmSettings(Section):
    """A Slurm cluster: where each hardware type is scheduled, and what fleetfit may do to running jobs."""

    partitions: HardwareMap = Field(
        default_factory=dict, description='hardware → the partition its nodes are in, e.g. {"L40S 48GB" = "l40s"}'
    )
    features: HardwareMap = Field(
        default_factory=dict, description="hardware → a node feature a job's constraint names (--constraint)"
    )
    gres_types: HardwareMap = Field(
        default_factory=dict, description="hardware → its GRES type (gpu:TYPE:N) in the site's gres.conf"
    )
    requeue_running: bool = Field(
        default=False, description="a running job may be requeued onto its target (it restarts from its checkpoint)"
    )
    cancel_idle: bool = Field(default=False, description="an idle allocation may be cancelled (scancel)")
    bin_dir: Path | None = Field(default=None, description="where scontrol, squeue, scancel are; default: PATH")
    slurm_conf: Path | None = Field(default=None, description="SLURM_CONF for the commands; default: Slurm's own")
    timeout: float = Field(default=30.0, gt=0, le=600, description="seconds each command may take")


class KubernetesSettings(Section):
    """A Kubernetes cluster: the GPU product label of each hardware type, and how it is reached."""

    kubeconfig: Path | None = Field(
        default=None, description="a kubeconfig: changes are dry-run on the server (dryRun=All), then patched"
    )
    context: str | None = Field(default=None, max_length=253, description="the kubeconfig's context to use")
    products: HardwareMap = Field(
        default_factory=dict,
        description="hardware → its nvidia.com/gpu.product label (GPU feature discovery), e.g. "
        '{"L40S 48GB" = "NVIDIA-L40S"}',
    )
    queues: HardwareMap = Field(
        default_factory=dict, description="hardware → the Kueue LocalQueue whose ResourceFlavor holds it"
    )
    namespace: str | None = Field(
        default=None, max_length=63, description="the namespace of workloads whose owner is not known"
    )
    timeout: float = Field(default=30.0, gt=0, le=600, description="seconds each API call may take")
