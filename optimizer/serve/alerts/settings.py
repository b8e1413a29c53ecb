"""Alert configuration: the ``[alerts]`` section and its ``[[alerts.receivers]]``."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from agent.config import Section, read_secret
from agent.protocol import WorkloadClass

ReceiverKind = Literal["slack", "mattermost", "teams", "generic"]

# Messages per second each platform accepts from one webhook before it answers 429.
DEFAULT_RATE = {"slack": 1.0, "mattermost": 1.0, "teams": 4.0, "generic": 10.0}
# Payload bytes each platform accepts (Teams Workflows: 28 KB; Mattermost: 16,383 characters per post).
DEFAULT_MAX_BYTES = {"slack": 40_000, "mattermost": 16_000, "teams": 28_000, "generic": 256_000}


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self)


class ReceiverSettings(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    kind: ReceiverKind
    url_env: str | None = Field(default=None, description="environment variable holding the webhook URL")
    url_file: Path | None = Field(
        default=None, description="file holding the webhook URL; relative paths are read from $CREDENTIALS_DIRECTORY"
    )
    sites: list[str] = Field(default_factory=list, description="only these sites; empty: all")
    classes: list[WorkloadClass] = Field(default_factory=list, description="only these workload classes; empty: all")
    min_monthly_savings: float = Field(default=0.0, ge=0)
    min_severity: Severity = Severity.INFO
    rate_per_second: float | None = Field(default=None, gt=0, le=100, description="default: the platform's limit")
    max_bytes: int | None = Field(default=None, ge=2_000, le=10_000_000, description="default: the platform's limit")

    @model_validator(mode="after")
    def _one_url_source(self) -> ReceiverSettings:
        if (self.url_env is None) == (self.url_file is None):
            raise ValueError(f"receiver {self.name}: set exactly one of url_env and url_file")
        return self

    @property
    def rate(self) -> float:
        return self.rate_per_second if self.rate_per_second is not None else DEFAULT_RATE[self.kind]

    @property
    def byte_limit(self) -> int:
        return self.max_bytes if self.max_bytes is not None else DEFAULT_MAX_BYTES[self.kind]

    def url(self) -> SecretStr:
        """The webhook URL, read when needed so rotated credentials take effect; never logged."""
        if self.url_env is not None:
            value = os.environ.get(self.url_env, "").strip()
            if not value:
                raise ValueError(f"receiver {self.name}: environment variable {self.url_env} is empty or unset")
            return SecretStr(value)
        assert self.url_file is not None
        try:
            return read_secret(self.url_file)
        except ValueError as exc:
            raise ValueError(f"receiver {self.name}: {exc}") from None


class AlertSettings(Section):
    receivers: list[ReceiverSettings] = Field(default_factory=list)
    group_wait: float = Field(default=30.0, ge=0, le=3600, description="seconds to gather a site's group")
    repeat_interval: float = Field(
        default=86_400.0, ge=0, description="seconds before an unacknowledged move is posted again; 0: never"
    )
    settle_seconds: float = Field(
        default=300.0, ge=0, le=86_400, description="seconds a new move must stay proposed before it is posted"
    )
    settle_plans: int = Field(
        default=2, ge=1, le=1_000, description="consecutive plans that must propose a new move before it is posted"
    )
    warning_usd: float = Field(default=1_000.0, ge=0, description="monthly saving from which a move is a warning")
    critical_usd: float = Field(default=10_000.0, ge=0, description="monthly saving from which it is critical")
    max_attempts: int = Field(default=6, ge=1, le=50)
    retry_initial: float = Field(default=1.0, gt=0, le=60)
    retry_max: float = Field(default=120.0, gt=0, le=3600, description="longest wait, Retry-After included")
    timeout: float = Field(default=10.0, gt=0, le=120, description="seconds per HTTP request")
    link: str | None = Field(default=None, description="URL of the recommendations page, linked from messages")
    flush_timeout: float = Field(default=30.0, ge=0, le=600, description="seconds to post what is pending at stop")

    @model_validator(mode="after")
    def _unique_names(self) -> AlertSettings:
        names = [r.name for r in self.receivers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"receiver names must be unique: {', '.join(dupes)}")
        return self

    def severity(self, monthly_savings: float) -> Severity:
        if monthly_savings >= self.critical_usd:
            return Severity.CRITICAL
        if monthly_savings >= self.warning_usd:
            return Severity.WARNING
        return Severity.INFO
