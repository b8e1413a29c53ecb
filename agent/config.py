"""Configuration: TOML files validated by pydantic, with ``FLEETFIT_…`` environment overrides for secrets.

A bad file fails at start with one line that names the key, e.g.
``config /etc/fleetfit/agent.toml: mqtt.port: Input should be less than or equal to 65535``.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from agent.protocol import DEFAULT_PREFIX, MIN_SAMPLE_INTERVAL, Ident
from collectors.nic import DEFAULT_FABRIC_PATTERNS

ENV_PREFIX = "FLEETFIT_"
# Tables and arrays nested in a TOML file, the document counted: the deepest honest file, the catalog, nests 6
# (the document, gpu, an entry, perf, a figure, its range). tomllib recurses a few frames a level, so a few KB nested
# 1,000 deep would otherwise end in a RecursionError, and pydantic would recurse again through what it took.
MAX_DEPTH = 64


class ConfigError(Exception):
    """A configuration problem, worded for the person who wrote the file."""


class TooDeep(ValueError):
    """Tables and arrays nested past ``MAX_DEPTH``."""


def nesting(value: object) -> int:
    """How deep dicts and lists nest in ``value`` (a scalar: 0); it stops counting past ``MAX_DEPTH``."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:  # a loop, not recursion: a file's dotted keys nest without bound and without recursing in tomllib
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_toml(text: str) -> dict[str, Any]:
    """``text`` as TOML; ``tomllib.TOMLDecodeError`` for bad TOML, ``TooDeep`` for tables and arrays nested past
    ``MAX_DEPTH``."""
    try:
        raw = tomllib.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than {MAX_DEPTH} tables and arrays") from None
    if nesting(raw) > MAX_DEPTH:
        raise TooDeep(f"nested deeper than {MAX_DEPTH} tables and arrays")
    return raw


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def credential_path(path: Path) -> Path:
    """``path``; a relative one is looked up in ``$CREDENTIALS_DIRECTORY`` when systemd passed credentials
    (``LoadCredential=``), so configs can name a credential rather than where it lives."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    return Path(directory) / path if directory and not path.is_absolute() else path


def read_secret(path: Path) -> SecretStr:
    """The first line of a secret file (a password, token or URL); ValueError when missing or empty."""
    where = credential_path(path)
    try:
        value = where.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {where}: {exc.strerror}") from None
    if not value:
        raise ValueError(f"{where} is empty")
    return SecretStr(value)


def secret_or_file(secret: SecretStr | None, path: Path | None, what: str) -> SecretStr | None:
    """The secret given inline (or by environment), else read from ``path``; both at once is a mistake."""
    if path is None:
        return secret
    if secret is not None:
        raise ValueError(f"{what} and {what}_file exclude each other")
    return read_secret(path)


class MqttSettings(Section):
    host: str = "localhost"
    port: int = Field(default=1883, ge=1, le=65535)
    protocol: Literal["5", "3.1.1"] = "5"
    prefix: str = Field(default=DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = Field(default=None, description="file holding the password (a credential)")
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive: int = Field(default=30, ge=5, le=3600)
    reconnect_max_delay: float = Field(default=30.0, gt=0, le=600)
    session_expiry: int = Field(
        default=0, ge=0, description="seconds the broker keeps this client's session and queue; 0: a clean session"
    )

    @model_validator(mode="after")
    def _client_cert_pair(self) -> MqttSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        self.password = secret_or_file(self.password, self.password_file, "password")
        for name in ("ca_file", "cert_file", "key_file"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, credential_path(value))
        return self


class AgentSettings(Section):
    node: Ident = Field(default_factory=lambda: socket.gethostname().split(".")[0])
    site: Ident = "default"
    publish_interval: float = Field(default=10.0, ge=1.0, le=3600.0)
    sample_interval: float = Field(default=1.0, ge=MIN_SAMPLE_INTERVAL, le=60.0)
    state_dir: Path = Path("/var/lib/fleetfit-agent")
    spool_max_windows: int = Field(default=8640, ge=1, description="windows kept while the broker is away")
    spool_max_mb: float = Field(default=256, gt=0, description="disk the spool may use")
    sent_keep_mb: float = Field(
        default=64,
        ge=0,
        description="disk for windows already acknowledged by the broker, kept in case the optimizer asks for them "
        "again (the broker dropped them from a full queue); 0: none kept",
    )
    fabric_interfaces: list[str] = Field(default_factory=lambda: list(DEFAULT_FABRIC_PATTERNS))
    mounts: list[str] = Field(default_factory=list, description="mount points whose usage each window reports")
    shutdown_timeout: float = Field(default=5.0, gt=0, le=120)
    publish_rate: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="windows a second published at most: a spool replay is paced to it; none: 0.9, or twice the "
        "live rate when that is higher",
    )
    publish_burst: int = Field(default=300, ge=1, description="windows published at once before pacing starts")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus self-metrics on this port; none: off"
    )
    metrics_listen: str = Field(default="127.0.0.1", description="address the metrics endpoint binds")
    sysfs_root: Path = Field(
        default=Path("/sys"),
        description="where sysfs is mounted: the PCI bus (which GPU vendors are present), NICs and disks are read "
        "under it; the host's /sys bind-mounted elsewhere in a container",
    )

    @model_validator(mode="after")
    def _window_holds_samples(self) -> AgentSettings:
        if self.publish_interval < self.sample_interval:
            raise ValueError("publish_interval must be at least sample_interval")
        if self.publish_rate is not None and self.publish_rate * self.publish_interval <= 1.0:
            raise ValueError("publish_rate must exceed one window per publish_interval, or a backlog never drains")
        return self

    @property
    def pace(self) -> float:
        """Windows a second the agent publishes at most."""
        return self.publish_rate if self.publish_rate is not None else max(0.9, 2.0 / self.publish_interval)


class AgentConfig(Section):
    agent: AgentSettings = Field(default_factory=AgentSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)

    @model_validator(mode="after")
    def _node_is_the_username(self) -> AgentConfig:
        """With a password and no username, log in as the node id: what the broker ACL confines."""
        if self.mqtt.password is not None and self.mqtt.username is None:
            self.mqtt.username = self.agent.node
        return self


ModelT = TypeVar("ModelT", bound=BaseModel)


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``FLEETFIT_MQTT_PASSWORD=x`` becomes ``{"mqtt": {"password": "x"}}``."""
    out: dict[str, dict[str, str]] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        section, _, name = key[len(ENV_PREFIX) :].lower().partition("_")
        if section and name:
            out.setdefault(section, {})[name] = value
    return out


def _merge(base: dict[str, Any], override: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    merged = dict(base)
    for section, values in override.items():
        current = merged.get(section)
        merged[section] = {**(current if isinstance(current, dict) else {}), **values}
    return merged


def load_config(model: type[ModelT], path: Path | None, environ: Mapping[str, str] | None = None) -> ModelT:
    """Read ``path`` (or nothing), apply environment overrides for the sections ``model`` has, validate."""
    raw: dict[str, Any] = {}
    where = str(path) if path else "defaults"
    if path is not None:
        try:
            raw = parse_toml(path.read_text())
        except OSError as exc:
            raise ConfigError(f"config {path}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config {path}: not a text file (a config is TOML)") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {path}: not valid TOML: {exc}") from None
        except TooDeep as exc:
            raise ConfigError(f"config {path}: {exc}") from None
    sections = set(model.model_fields)
    overrides = {k: v for k, v in env_overrides(os.environ if environ is None else environ).items() if k in sections}
    try:
        return model.model_validate(_merge(raw, overrides))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        key = ".".join(loc) or "(top level)"
        if len(loc) >= 2 and loc[1] in overrides.get(loc[0], {}):  # the environment, not the file, set it
            variable = f"{ENV_PREFIX}{loc[0]}_{loc[1]}".upper()
            raise ConfigError(f"environment {variable}: {key}: {first['msg']}") from None
        raise ConfigError(f"config {where}: {key}: {first['msg']}") from None
