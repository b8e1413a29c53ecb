"""Optimizer configuration (TOML sections ``[optimizer]``, ``[mqtt]``, ``[plan]``, ``[prices]``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork, SecretStr, field_validator, model_validator

from agent.config import MqttSettings, Section, credential_path, secret_or_file
from agent.protocol import Ident
from optimizer.act.registry import Scheduler
from optimizer.act.settings import KubernetesSettings, SlurmSettings
from optimizer.plan.recommend import PlanSettings
from optimizer.serve.alerts.settings import AlertSettings
from optimizer.serve.audit import MAX_ENTRIES, RETENTION_DAYS
from optimizer.serve.store import StoreSettings
from optimizer.serve.tokens import TokenFileError, read_private

# a price a plan multiplies by every GPU-hour: zero, negative or infinite would turn every saving into nonsense
Price = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def _not_finite(value: object, where: str) -> str | None:
    """The key of the first number in ``value`` (a model, a dict, a list) that is infinite or NaN, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, BaseModel):
        items: list[tuple[str, object]] = [(k, getattr(value, k)) for k in type(value).model_fields]
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None
    for key, item in items:
        if (found := _not_finite(item, f"{where}.{key}" if where else key)) is not None:
            return found
    return None


class ApiSettings(BaseModel):
    """The HTTP API and console (``[api]``)."""

    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default="127.0.0.1", description="address to bind; empty: no HTTP API")
    port: int = Field(default=8470, ge=0, le=65535)
    token: SecretStr | None = Field(
        default=None, description="the old shared bearer token, an admin named shared-token (FLEETFIT_API_TOKEN)"
    )
    token_file: Path | None = Field(default=None, description="file holding the shared bearer token (a credential)")
    tokens_file: Path | None = Field(
        default=None,
        description="tokens per person or service, one a line (name role sha256:HEX, written by fleetfit token add), "
        "reread when it changes; readable by its owner and group only",
    )
    read_requires_token: bool = Field(
        default=False,
        description="reads of the console and the API need a viewer token too (health and metrics stay open)",
    )
    trusted_proxies: list[IPvAnyNetwork] = Field(
        default_factory=list,
        description="addresses of reverse proxies whose X-Forwarded-For names the client in the audit log",
    )
    audit_retention_days: float = Field(
        default=RETENTION_DAYS, gt=0, le=36_500, description="days audit entries are kept"
    )
    audit_max_entries: int = Field(default=MAX_ENTRIES, ge=100, le=10_000_000, description="audit entries kept at most")
    hosts: list[str] = Field(
        default_factory=list,
        description="names the API is reached by, beyond its listen address, localhost and (listening on every "
        "address) this machine's names and addresses: a request naming another Host is refused (DNS rebinding)",
    )
    header_timeout: float = Field(default=10.0, gt=0, le=600, description="seconds a client has to send a request")
    request_timeout: float = Field(default=30.0, gt=0, le=600, description="seconds to read and answer one request")
    max_connections: int = Field(default=512, ge=8, le=60_000, description="open connections at most")

    @field_validator("tokens_file")
    @classmethod
    def _tokens_file_usable(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        where = credential_path(value)
        try:
            read_private(where)
        except TokenFileError as exc:
            raise ValueError(str(exc)) from None
        return where

    @model_validator(mode="after")
    def _token_file(self) -> ApiSettings:
        self.token = secret_or_file(self.token, self.token_file, "token")
        if self.read_requires_token and self.token is None and self.tokens_file is None:
            raise ValueError("read_requires_token needs tokens_file (or the shared token): nobody could read")
        return self


class OptimizerSettings(Section):
    client_id: str = Field(default="fleetfit-optimizer", min_length=1, max_length=64)
    state_dir: Path = Path("/var/lib/fleetfit-optimizer")
    solve_interval: float = Field(default=60.0, ge=0.5, le=86_400)
    plan_cpu_share: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="share of one core planning may take on average: where a round of plans takes more CPU than "
        "this share of solve_interval (a large site: features, classification and the solve grow with its nodes), "
        "rounds are spaced further apart than solve_interval, and ingest keeps the rest",
    )
    horizon_windows: int = Field(default=60, ge=3, le=100_000)
    catalog: Path | None = None
    shared_group: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="subscribe as this MQTT shared-subscription group: processes in it split the stream",
    )
    sites: list[Ident] = Field(
        default_factory=list,
        max_length=10_000,
        description="the sites this optimizer plans (it follows only their nodes); empty: every site that no "
        "optimizer listing sites claims. Optimizers sharing a broker agree who plans what through retained "
        "presence messages (docs/operations.md, Scaling out)",
    )
    standby_sites: list[Ident] = Field(
        default_factory=list,
        max_length=10_000,
        description="sites this optimizer follows and plans only while no optimizer online lists them in sites",
    )
    peers: dict[Ident, list[Ident]] = Field(
        default_factory=dict,
        max_length=10_000,
        description="the other optimizers on the broker, each with the sites its broker account may serve (as "
        "`mint optimizer DIR NAME SITE...` granted them): a presence then counts only for the sites listed for its "
        "optimizer, and not at all from an optimizer not listed. Empty: every presence is believed as it claims "
        "(docs/operations.md, A forged claim)",
    )
    max_queued_messages: int = Field(
        default=200_000,
        ge=1000,
        description="no longer used (messages are taken in as they are read); accepted so that configs load",
    )
    max_clock_skew: float = Field(
        default=86_400.0, gt=0, description="seconds a window may lie behind or ahead of now (a birth: ahead)"
    )
    node_replay_seconds: float = Field(
        default=86_400.0,
        ge=60,
        description="seconds of window time one node may deliver at once: its spool replayed after an outage, or "
        "what the broker kept for an optimizer that was away. Windows are limited by the time they cover, never by "
        "when they arrive (the agent's spool holds a day at its defaults)",
    )
    node_time_rate: float = Field(
        default=1.25, gt=1.0, description="seconds of window time one node may deliver a second, sustained (above 1)"
    )
    node_refusal_burst: int = Field(
        default=360, ge=1, description="messages of one node refused at once before its next ones are refused unread"
    )
    node_refusal_rate: float = Field(default=1.0, gt=0, description="refusals a second one node may earn, sustained")
    node_birth_burst: int = Field(
        default=30, ge=2, description="births and states one node may send at once (one of each per connection)"
    )
    node_birth_rate: float = Field(default=0.2, gt=0, description="births and states a second, sustained")
    node_window_rate: float | None = Field(
        default=None, description="no longer used: windows are limited by the time they cover (node_replay_seconds)"
    )
    node_window_burst: int | None = Field(default=None, description="no longer used (see node_window_rate)")
    request_resends: bool = Field(
        default=True,
        description="ask a node for windows missing from its sequence (dropped by a full broker queue); needs each "
        "node's windows to reach one optimizer (no round-robin shared subscription)",
    )
    max_workloads_per_node: int = Field(
        default=32, ge=1, le=10_000, description="distinct workloads within the horizon"
    )
    max_gpus_per_node: int = Field(
        default=16,
        ge=1,
        le=64,
        description="physical GPUs a node's birth may claim (AMD compute partitions count as their share of one)",
    )

    @model_validator(mode="after")
    def _sites_once(self) -> OptimizerSettings:
        both = sorted(set(self.sites) & set(self.standby_sites))
        if both:
            raise ValueError(f"standby_sites: {', '.join(both)} also in sites (a standby is for others' sites)")
        return self


class SiteSettings(Section):
    """One site (``[sites.NAME]``)."""

    inventory: Path | None = Field(
        default=None,
        description="CSV (node,hardware,gpus) from the site's inventory of record: nodes are planned "
        "from it, and a node that claims other or more GPUs is flagged",
    )
    scheduler: Scheduler | None = Field(
        default=None, description="the scheduler `fleetfit apply` carries acknowledged actions out through"
    )
    slurm: SlurmSettings | None = None
    kubernetes: KubernetesSettings | None = None

    @model_validator(mode="after")
    def _one_scheduler(self) -> SiteSettings:
        for name in ("slurm", "kubernetes"):
            if getattr(self, name) is not None and self.scheduler != name:
                raise ValueError(f"[{name}] is set but scheduler is {self.scheduler or 'not set'}")
        return self


class PrometheusSource(Section):
    """Agentless nodes read from a Prometheus-compatible server's dcgm-exporter series (``[sources.prometheus]``,
    docs/prometheus.md)."""

    url: str = Field(pattern=r"^https?://[^\s/]+", description="the server's base URL, http(s)://HOST[:PORT][/path]")
    site: Ident = Field(default="default", description="the site its nodes are planned in")
    interval: float = Field(
        default=300.0, ge=60, le=3600, description="seconds between reads; each read takes the windows completed since"
    )
    step: float = Field(default=30.0, gt=0, le=600, description="seconds between points read (the scrape interval)")
    backfill: float = Field(
        default=3600.0, ge=0, le=86_400, description="seconds of history read at start, so plans need not wait"
    )
    node_label: str | None = Field(default=None, max_length=128, description="default: Hostname, else hostname")
    owner_label: str | None = Field(default=None, max_length=128, description="a pod label naming the owning team")
    selector: str = Field(default="", max_length=1000, description='extra label matchers, e.g. cluster="eu-1"')
    bearer_token_file: Path | None = Field(default=None, description="a file holding the bearer token (a credential)")
    basic_auth_user: str | None = None
    basic_auth_password_file: Path | None = None
    ca_file: Path | None = None
    timeout: float = Field(default=60.0, gt=0, le=600, description="seconds a query may take")

    @model_validator(mode="after")
    def _consistent(self) -> PrometheusSource:
        if self.bearer_token_file is not None and self.basic_auth_user is not None:
            raise ValueError("give bearer_token_file or basic_auth_user, not both")
        if self.interval < 2 * self.step:
            raise ValueError(f"interval {self.interval:g} s holds fewer than two points at step {self.step:g} s")
        return self


class SourcesSettings(Section):
    """Where nodes without an agent are read from (``[sources]``)."""

    prometheus: PrometheusSource | None = None


class OptimizerConfig(Section):
    optimizer: OptimizerSettings = Field(default_factory=OptimizerSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    plan: PlanSettings = Field(default_factory=PlanSettings)
    influxdb: StoreSettings = Field(default_factory=StoreSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    prices: dict[str, Price] = Field(
        default_factory=dict, description="price per GPU-hour by catalog key: positive and finite"
    )
    sites: dict[Ident, SiteSettings] = Field(default_factory=dict, description="per-site settings, by site id")
    sources: SourcesSettings = Field(default_factory=SourcesSettings)

    @model_validator(mode="after")
    def _finite(self) -> OptimizerConfig:
        """Every figure finite, in every section (a TOML ``inf`` or ``nan`` passes a bound like ``gt=0``)."""
        key = _not_finite(self, "")
        if key is not None:
            raise ValueError(f"{key} must be a finite number")
        return self
