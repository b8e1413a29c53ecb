"""What one alert message says: a site's new, still-open and resolved recommendations."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from agent.protocol import Finding, Recommendation, WorkloadClass
from optimizer.plan.render import numbered, order_key, total_text
from optimizer.serve.alerts.settings import Severity


class Status(StrEnum):
    NEW = "new"  # first time this receiver hears of the move
    REMINDER = "reminder"  # still proposed and unacknowledged after repeat_interval
    APPLIED = "applied"  # resolved: the workload now runs on the recommended hardware
    EXPIRED = "expired"  # resolved: plans stopped proposing it
    # `fleetfit apply --execute` (optimizer/commands/apply.py): the scheduler's answer, with its command
    CARRIED_OUT = "carried_out"  # the scheduler accepted the change; the move is applied once seen on its target
    FAILED = "failed"  # the scheduler refused it or could not be reached

    @property
    def resolved(self) -> bool:
        return self in (Status.APPLIED, Status.EXPIRED, Status.CARRIED_OUT, Status.FAILED)


@dataclass(frozen=True, slots=True)
class Item:
    recommendation: Recommendation
    status: Status
    severity: Severity
    detail: str = ""  # carried out or failed: the backend and its command, or what it said

    @property
    def id(self) -> str:
        return self.recommendation.id


@dataclass(slots=True)
class Notice:
    site: str
    generated_at: float
    items: list[Item] = field(default_factory=list)
    link: str | None = None
    # the plan's costliest GPUs waiting on the rest of their node (a fix there, not a move): said beside the moves
    waiting: list[Finding] = field(default_factory=list)

    @property
    def firing(self) -> list[Item]:
        # in the order to carry them out, as every other listing of a plan
        return sorted((i for i in self.items if not i.status.resolved), key=lambda i: order_key(i.recommendation))

    @property
    def numbers(self) -> dict[str, int]:
        """Each firing action's number, in the order to carry them out."""
        return numbered(i.recommendation for i in self.firing)

    @property
    def resolved(self) -> list[Item]:
        return sorted((i for i in self.items if i.status.resolved), key=lambda i: i.id)

    @property
    def monthly_savings(self) -> float:
        return sum(i.recommendation.monthly_savings_usd for i in self.firing)

    @property
    def severity(self) -> Severity:
        return max((i.severity for i in self.firing), key=lambda s: s.rank, default=Severity.INFO)

    def title(self) -> str:
        firing, resolved = self.firing, self.resolved
        parts = []
        if firing:
            parts.append(f"{len(firing)} action(s) would save {total_text(i.recommendation for i in firing)}")
        done = [i for i in resolved if i.status not in (Status.CARRIED_OUT, Status.FAILED)]
        if done:
            parts.append(f"{len(done)} resolved")
        for status, word in ((Status.CARRIED_OUT, "carried out"), (Status.FAILED, "failed")):
            if n := sum(1 for i in resolved if i.status == status):
                parts.append(f"{n} {word}")
        return f"fleetfit · {self.site}: " + ", ".join(parts or ["nothing to report"])


def sample_notice(site: str = "example") -> Notice:
    """A made-up notice for ``fleetfit alerts test``."""
    rec = Recommendation(
        id="sample-0000",
        workload="k8s/sample",
        workload_name="chat-frontend (sample)",
        workload_class=WorkloadClass.INFERENCE,
        confidence=0.93,
        gpus=2,
        from_node="gpu-h100-01",
        from_hardware="H100-SXM5-80GB",
        to_node="gpu-l40s-07",
        to_hardware="L40S",
        monthly_savings_usd=3_150.0,
        reason="inference at 28 % utilisation holding H100s with NVLink and InfiniBand",
        performance_impact="about 10 % lower peak throughput; well within the service's daily peak",
        risk="low",
        evidence=["steady serving traffic, 9x daily swing", "28 % mean SM busy, peak 61 %"],
    )
    return Notice(site=site, generated_at=time.time(), items=[Item(rec, Status.NEW, Severity.WARNING)])
