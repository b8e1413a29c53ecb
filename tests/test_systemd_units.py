"""The shipped systemd units: `systemd-analyze verify` passes, and their sandboxes score the exposure
docs/operations.md promises under `systemd-analyze security --offline=yes`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT

UNITS = Path(__file__).resolve().parent.parent / "systemd"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
MAX_EXPOSURE = {"fleetfit-agent.service": 2.0, "fleetfit-optimizer.service": 2.5}


def _installed(tmp_path: Path, name: str) -> Path:
    """The unit as installed, with ExecStart pointing at this checkout's command (verify checks it exists)."""
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is not installed: `make test` installs it (apt-get install systemd)")
    unit = tmp_path / name
    unit.write_text((UNITS / name).read_text().replace("/opt/fleetfit/bin/fleetfit", FLEETFIT))
    return unit


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_unit_verifies_and_its_exposure_is_as_documented(tmp_path: Path, name: str) -> None:
    unit = _installed(tmp_path, name)
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verify.returncode == 0 and name not in verify.stderr, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(rf"Overall exposure level for {re.escape(name)}: ([0-9.]+)", security.stdout)
    assert found, security.stdout[-2000:] + security.stderr
    exposure = float(found.group(1))
    assert exposure <= MAX_EXPOSURE[name]
    assert f"`{name}` | {exposure}" in DOCS.read_text()  # the figure in the docs is today's


def test_units_keep_the_essentials() -> None:
    agent = (UNITS / "fleetfit-agent.service").read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "StateDirectory=fleetfit-agent",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
        "DeviceAllow=char-nvidia* rw",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "LoadCredential=mqtt-password:",
    ):
        assert line in agent, line
    # NVLink links come up when the fabric manager has trained them; the agent starts after it where it exists
    (after,) = [line for line in agent.splitlines() if line.startswith("After=")]
    assert "nvidia-fabricmanager.service" in after.split("=", 1)[1].split()
    # The agent exits to reload a replaced GPU driver's library: restarted, but never in a fast loop
    limits = dict(line.split("=", 1) for line in agent.splitlines() if line.startswith(("StartLimit", "RestartSec")))
    assert int(limits["StartLimitBurst"]) * int(limits["RestartSec"]) < int(limits["StartLimitIntervalSec"])
    optimizer = (UNITS / "fleetfit-optimizer.service").read_text()
    for line in ("DynamicUser=yes", "StateDirectory=fleetfit-optimizer", "PrivateDevices=yes", "Restart=on-failure"):
        assert line in optimizer, line
