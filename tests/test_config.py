"""Configuration: one clear line naming the key, environment overrides for secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import MAX_DEPTH, AgentConfig, ConfigError, load_config, parse_toml
from optimizer.commands import cli
from optimizer.decide.catalog import CatalogError, load_catalog
from optimizer.serve.config import OptimizerConfig
from optimizer.serve.lifecycle import Lifecycle


def test_defaults_load_without_a_file() -> None:
    config = load_config(AgentConfig, None, environ={})
    assert config.agent.publish_interval == 10.0
    assert config.mqtt.protocol == "5"


def test_bad_value_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[mqtt]\nport = 70000\n")
    with pytest.raises(ConfigError, match=r"agent.toml: mqtt.port: .*65535"):
        load_config(AgentConfig, path, environ={})


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[agent]\npublish_intreval = 5\n")
    with pytest.raises(ConfigError, match=r"agent.publish_intreval"):
        load_config(AgentConfig, path, environ={})


def test_cross_field_check(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[agent]\npublish_interval = 1\nsample_interval = 2\n")
    with pytest.raises(ConfigError, match="publish_interval must be at least sample_interval"):
        load_config(AgentConfig, path, environ={})


def test_invalid_toml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "optimizer.toml"
    path.write_text("[optimizer\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(OptimizerConfig, path, environ={})


def test_environment_overrides_secrets(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[mqtt]\nhost = "broker.example"\nusername = "node-1"\n')
    config = load_config(AgentConfig, path, environ={"FLEETFIT_MQTT_PASSWORD": "s3cret", "UNRELATED": "x"})
    assert config.mqtt.host == "broker.example"
    assert config.mqtt.password is not None and config.mqtt.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(config)


def test_cli_fails_at_start_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "optimizer.toml"
    path.write_text("[plan]\nmin_confidence = 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "optimizer.commands.cli", "optimizer", "--config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1  # the config's contents: a data error
    assert result.stderr.strip().splitlines()[-1].startswith("fleetfit: config ")
    assert "plan.min_confidence" in result.stderr


def test_a_file_nested_past_the_bound_is_refused_in_one_line(tmp_path: Path) -> None:
    """20,000 arrays deep (40 KB), 20,000 inline tables deep, 100 dotted keys deep (tomllib does not recurse on
    those): each refused naming the file, the CLI's bad-input status, no traceback. Deliberate bugs caught:
    tomllib's RecursionError let through (a 3,000-line traceback, status 1), or the depth not counted after
    parsing (the dotted keys reach pydantic)."""
    path = tmp_path / "optimizer.toml"
    path.write_text("a = " + "[" * 20_000 + "]" * 20_000 + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "optimizer.commands.cli", "optimizer", "--config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"fleetfit: config {path}: nested deeper than {MAX_DEPTH} tables and arrays"]
    for text in ("a = " + "{b=" * 20_000 + "}" * 20_000, "[agent." + ".".join(["x"] * 100) + "]\ny = 1"):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=f"^config {path}: nested deeper than {MAX_DEPTH}"):
            load_config(AgentConfig, path, environ={})


def test_nesting_is_refused_one_level_past_the_bound() -> None:
    """The document counts as one level: 63 arrays inside it are 64 levels, kept; 64 arrays are refused.
    Deliberate bug caught: the bound off by one, or the document not counted."""
    assert parse_toml("a = " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))["a"]
    with pytest.raises(ValueError, match="nested deeper"):
        parse_toml("a = " + "[" * MAX_DEPTH + "]" * MAX_DEPTH)


def test_shipped_example_configs_are_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parent.parent / "systemd"
    (tmp_path / "mqtt-password").write_text("s3cret\n")  # what LoadCredential= puts in place
    (tmp_path / "mqtt-ca").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    agent = load_config(AgentConfig, root / "agent.toml", environ={"FLEETFIT_AGENT_NODE": "gpu-017"})
    assert agent.agent.site == "eu-west-1" and agent.mqtt.tls
    assert agent.mqtt.password is not None and agent.mqtt.password.get_secret_value() == "s3cret"
    assert agent.mqtt.username == "gpu-017" and agent.mqtt.ca_file == tmp_path / "mqtt-ca"
    (tmp_path / "api-token").write_text("t0ken\n")
    optimizer = load_config(OptimizerConfig, root / "optimizer.toml", environ={})
    assert optimizer.plan.max_moves == 20
    # the optimizer logs in to the locked-down broker with its own account, and its API token is a credential
    assert optimizer.mqtt.tls and optimizer.mqtt.port == 8883 and optimizer.mqtt.username == "fleetfit-optimizer"
    assert optimizer.mqtt.password is not None and optimizer.mqtt.password.get_secret_value() == "s3cret"
    assert optimizer.api.token is not None and optimizer.api.token.get_secret_value() == "t0ken"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError, match="mqtt: Value error, cannot read mqtt-password"):
        load_config(AgentConfig, root / "agent.toml", environ={})
    with pytest.raises(ConfigError, match="cannot read mqtt-password"):
        load_config(OptimizerConfig, root / "optimizer.toml", environ={})


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ("[prices]\nh100 = -2\n", r"prices.h100: Input should be greater than 0"),
        ("[prices]\nh100 = inf\n", r"prices.h100: Input should be a finite number"),
        ("[prices]\nh100 = nan\n", r"prices.h100: Input should be a finite number"),
        ("[plan]\nmin_monthly_savings = inf\n", r"plan.min_monthly_savings must be a finite number"),
    ],
)
def test_a_price_or_figure_that_is_not_positive_and_finite_is_refused(tmp_path: Path, body: str, refusal: str) -> None:
    """Deliberate bugs caught: ``[prices]`` values typed as any float (a negative price made every move to that GPU
    a saving), and no finiteness check across sections (TOML's inf passes ``ge=0``)."""
    path = tmp_path / "optimizer.toml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=refusal):
        load_config(OptimizerConfig, path, environ={})


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("price_per_gpu_hour = 3.2\n", "price_per_gpu_hour = inf\n", "price_per_gpu_hour"),
        ("price_per_gpu_hour = 3.2\n", "price_per_gpu_hour = -1.0\n", "price_per_gpu_hour"),
        ("price_per_gpu_hour = 3.2\n", "price_per_gpu_hour = 0.0\n", "price_per_gpu_hour"),
        ("memory_gib = 80\n", "memory_gib = inf\n", "memory_gib"),
    ],
)
def test_a_catalog_price_or_figure_that_is_not_positive_and_finite_is_refused(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    """Deliberate bug caught: the catalog's price bounded by ``ge=0`` alone (inf and 0 were taken) and its datasheet
    figures by ``gt=0`` alone (inf was taken)."""
    text = (Path(__file__).resolve().parent.parent / "optimizer" / "decide" / "data" / "catalog.toml").read_text()
    assert old in text
    path = tmp_path / "catalog.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(CatalogError, match=key):
        load_catalog(path)
    with pytest.raises(CatalogError, match="h100: a price per GPU-hour is positive and finite"):
        load_catalog().with_prices({"h100": float("inf")})


def test_a_refused_config_writes_nothing_and_reads_say_where_they_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config refused at start (a price for a GPU the catalog does not know: refused once the catalog is read)
    leaves no state directory behind, and the read commands name the directory they read on stderr. Deliberate bug
    caught: the state directory and its database opened before the prices were checked."""
    state = tmp_path / "state"
    path = tmp_path / "optimizer.toml"
    path.write_text(f'[optimizer]\nstate_dir = "{state}"\n[prices]\nno_such_gpu = 2.0\n')
    assert cli.main(["optimizer", "--config", str(path)]) == 1
    assert "no_such_gpu" in capsys.readouterr().err.splitlines()[-1]
    assert not state.exists()
    path.write_text(f'[optimizer]\nstate_dir = "{state}"\n')
    assert cli.main(["report", "--config", str(path)]) == 1
    assert f"{state}/fleetfit.db does not exist" in capsys.readouterr().err  # the refusal names it
    Lifecycle.in_state_dir(state).close()  # an optimizer's state, with nothing in it yet
    for command in ("recommendations", "report"):
        assert cli.main([command, "--config", str(path)]) == 0
        assert capsys.readouterr().err == f"fleetfit: reading the optimizer's state in {state}\n", command
