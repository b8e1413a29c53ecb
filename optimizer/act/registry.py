"""The scheduler backends by name (``[sites.NAME] scheduler = …``), registered here and nowhere else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from optimizer.act.backend import Backend
from optimizer.act.kubernetes import Kubernetes
from optimizer.act.settings import KubernetesSettings, SlurmSettings
from optimizer.act.slurm import Slurm

Scheduler = Literal["slurm", "kubernetes"]

BACKENDS: dict[str, Callable[[SlurmSettings | None, KubernetesSettings | None], Backend]] = {
    "slurm": lambda slurm, _: Slurm(slurm or SlurmSettings()),
    "kubernetes": lambda _, kube: Kubernetes(kube or KubernetesSettings()),
}


def backend(scheduler: str, slurm: SlurmSettings | None, kubernetes: KubernetesSettings | None) -> Backend:
    """The backend a site's settings name; KeyError for a name not registered."""
    return BACKENDS[scheduler](slurm, kubernetes)
